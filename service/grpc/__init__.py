"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``, what ``tritonclient.grpc`` speaks).

- ``protos/``: Triton's protocol files; ``generated/``: their compiled modules (``generate.py``);
- ``server.py``: the ``grpc.aio`` server, started and stopped with the HTTP server, in its event loop;
- ``service.py``: each RPC, on the same operations as the REST routes (``service/oip/``);
- ``calls.py``: what every call shares: API keys, deadlines, metrics, errors as gRPC status codes;
- ``tensors.py``: the protocol's messages to and from ``service/oip/tensors.py``'s tensors.
"""
