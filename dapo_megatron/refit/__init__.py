"""The refit: the trained policy's weights into the rollout engines that are not the policy.

The transport is chosen once, outside this package: ``config/refit_transport.py``
(``RunPlan.refit_transport``, a ``RefitTransport``); nothing here compares its name.

Where each piece lives:

* ``controller/actors/refitter.py``: ``Refitter``, the one object the controller holds (it forms
  the weight group, submits a transfer to the policy ranks and the engines through their
  typed methods, and waits for it: ``PendingRefit``);
* ``transport.py``: the transport interface, a sender half (policy ranks) and a receiver
  half (engine workers) per transport; ``broadcast.py`` (buckets over an NCCL/gloo weight
  group), ``ipc.py`` (a shared buffer: CUDA IPC on GPU, shared memory on CPU) and
  ``object_store.py`` (the whole model through Ray's object store, the fallback);
* ``halves.py``: which sender and receiver halves a collective transport is built from;
* ``sender.py``: a policy rank's end (``PolicySender``, held by ``PolicyWorker``);
* ``receiver.py``: an engine worker's end (``EngineReceiver``), used by both engines'
  typed receive methods (``generation.base.GenerationBackend``: the vLLM backend's worker
  extension and the Megatron engine);
* ``buckets.py``: the bucket layout shared by both collective transports;
* ``group.py``: the weight-update group and its host-side handshake (``begin_transfer``);
* ``stats.py``: ``TransferStats``, what one side moved (the one statistics type);
* ``faults.py``: the fault hook of the restart tests (an engine worker dying mid-refit).
"""
