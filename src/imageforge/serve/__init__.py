"""Serving a target: the server runtime, in a container or as a process on this machine (in-place mode).

* :mod:`.runtime`: the one serving ``Runtime`` a command gets (prepare: the image build or the journaled apply in
  place; serving; restoring) and its ``Prepared``; its two implementations are ``container.ContainerRuntime`` and
  ``process.ProcessRuntime``;
* :mod:`.spec`: what a serving container is (the docker SDK's ``containers.create`` arguments), pure;
* :mod:`.container`: the container runtime: ``start_server``, ``wait_ready``, ``serving``, ``start_detached``,
  ``stop_servers``;
* :mod:`.process`: the same serving command as a process, without Docker (``apply --in-place``'s server):
  start, record, wait, stop; :mod:`.process_spec` renders what it runs, :mod:`.procfs` reads ``/proc``;
* :mod:`.startfail`: a start of either that dies before ``/health`` blamed on the step that wrote the file its
  traceback goes through (the first start proves the imports a default build leaves out).

Nothing is imported here: import the module you need. Neither imports the docker SDK at import time (in-place
mode runs where it is not installed; ``tests/unit/test_serve_process.py`` checks it).
"""
