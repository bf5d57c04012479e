"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``, what ``tritonclient.grpc`` speaks).

A transport over the serving core (``service/core/``, ``service/oip/``), a peer of ``service/http/``,
which it never imports:

- ``protos/``: Triton's protocol files; ``generated/``: their compiled modules (``generate.py``);
- ``server.py``: the ``grpc.aio`` server, which the process (``service/process.py``) starts beside HTTP;
- ``service.py``: each RPC, on the Open Inference Protocol's operations (``service/oip/``);
- ``calls.py``: what every call shares: API keys, deadlines, the in-flight bound, metrics, errors as
  gRPC status codes;
- ``tensors.py``: the protocol's messages to and from ``service/oip/tensors.py``'s tensors.
"""
