"""The parts of the serving core that the transports call: what a request needs whatever it came by.

- ``serving.py``: the running service's parts, built at start-up and stopped at shutdown (``Serving``);
- ``keys.py``: optional API keys and their check; ``deadlines.py``: a request's deadline;
  ``admission.py``: the bound on requests in flight, one for every transport;
- ``caller.py``: who asks (the key's fingerprint, how to await an answer) and the attention store as
  their records' owner;
- ``classify.py``, ``translate.py``: the operations, typed inputs in, answers or a ``ServiceError`` out.

The rest of the core is the rest of ``service/`` (the registry, the engines, the model adapters, the
attention maps, settings, metrics, errors; ``oip/`` for the Open Inference Protocol). HTTP
(``service/http/``) and gRPC (``service/grpc/``) map their wire formats to these operations and their
errors to their status codes; none of the core imports either (``tests/test_imports.py``).
"""
