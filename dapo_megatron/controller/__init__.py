"""The Ray controller: cluster, policy worker group, the DAPO loop and its run state."""
