"""Each RPC of ``inference.GRPCInferenceService``, on the same operations as the REST routes (``service/oip/``).

So a gRPC inference goes to the model's own batcher or scheduler with ``/classify``, ``/translate``
and ``/v2/.../infer`` requests, is batched with them, and counts against the same in-flight bound. ``ModelStreamInfer`` answers each request
of the stream with one response (an error in ``error_message``, the stream going on), as they
finish, which need not be the order they came in: a response carries its request's ``id``. The
shared-memory, trace and log RPCs are not offered (``UNIMPLEMENTED``, the generated base's answer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc

from service.core.caller import Caller
from service.core.deadlines import deadline, oip_timeout
from service.errors import ServiceError
from service.grpc import tensors
from service.grpc.calls import INTERNAL_MESSAGE, Calls, failed, rpc
from service.grpc.generated import grpc_service_pb2 as pb
from service.grpc.generated import model_config_pb2
from service.grpc.generated.grpc_service_pb2_grpc import GRPCInferenceServiceServicer
from service.logs import new_request_id
from service.oip import operations
from service.registry import Status

log = logging.getLogger("attnserve.grpc")


class InferenceService(GRPCInferenceServiceServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.serving = calls.serving

    @rpc("ServerLive", open_access=True)
    async def ServerLive(self, request, context, key_id):
        return pb.ServerLiveResponse(live=True)

    @rpc("ServerReady", open_access=True)
    async def ServerReady(self, request, context, key_id):
        ready, _ = self.serving.readiness()  # not ready from SIGTERM on: draining
        return pb.ServerReadyResponse(ready=ready)

    @rpc("ModelReady")
    async def ModelReady(self, request, context, key_id):
        """Ready or not, as Triton answers: an unknown model or version is not ready (no error)."""
        versions = self.serving.registry.versions.get(request.name, {})
        if request.version:
            model = versions.get(request.version)
        else:
            model = self.serving.registry.models.get(request.name) if versions else None
        ready = (
            model is not None
            and model.status is Status.READY
            and not model.failing
            and not self.serving.draining.active
        )
        return pb.ModelReadyResponse(ready=ready)

    @rpc("ServerMetadata")
    async def ServerMetadata(self, request, context, key_id):
        return pb.ServerMetadataResponse(**operations.server_metadata())

    @rpc("ModelMetadata")
    async def ModelMetadata(self, request, context, key_id):
        model = operations.served_model(self.serving, request.name, request.version or None)
        return tensors.from_json(operations.model_metadata(self.serving, model), pb.ModelMetadataResponse())

    @rpc("ModelConfig")
    async def ModelConfig(self, request, context, key_id):
        model = operations.served_model(self.serving, request.name, request.version or None)
        config = tensors.from_json(operations.model_configuration(self.serving, model), model_config_pb2.ModelConfig())
        return pb.ModelConfigResponse(config=config)

    @rpc("ModelStatistics")
    async def ModelStatistics(self, request, context, key_id):
        stats = operations.statistics(self.serving, request.name or None, request.version or None)
        return tensors.from_json({"model_stats": stats}, pb.ModelStatisticsResponse())

    @rpc("RepositoryIndex")
    async def RepositoryIndex(self, request, context, key_id):
        entries = self.serving.lifecycle.index()
        if request.ready:
            entries = [e for e in entries if e["state"] == "READY"]
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

    @rpc("RepositoryModelLoad")
    async def RepositoryModelLoad(self, request, context, key_id):
        await self.serving.lifecycle.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @rpc("RepositoryModelUnload")
    async def RepositoryModelUnload(self, request, context, key_id):
        await self.serving.lifecycle.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    @rpc("ModelInfer", queues_work=True)
    async def ModelInfer(self, request, context, caller):
        return await self._infer(request, caller, context.time_remaining())

    async def _infer(self, request: pb.ModelInferRequest, caller: Caller, remaining_s: float | None):
        arrived = time.monotonic()
        model = operations.served_model(self.serving, request.model_name, request.model_version or None)
        with self.serving.registry.intake.receiving():
            req = tensors.read_request(request)
        until = deadline(self.serving.settings, remaining_s, oip_timeout(req.parameters), arrived=arrived)
        outputs = await operations.infer(self.serving, caller, model, req, until)
        return tensors.write_response(req, model.name, model.version, outputs)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """One response per request of the stream, as each is answered; the stream ends with the client's."""
        metadata = dict(context.invocation_metadata() or ())
        request_id = metadata.get("x-request-id") or new_request_id()
        try:
            key_id = self.calls.authenticate(context)
        except ServiceError as e:
            self.calls.observe("ModelStreamInfer", e.status, time.perf_counter(), context, request_id, None)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, e.message)
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: set[asyncio.Task] = set()

        async def answer(request: pb.ModelInferRequest) -> None:
            answers.put_nowait(await self._stream_one(request, self.calls.caller(key_id, context), context, request_id))

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.ensure_future(answer(request))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(set(running))
            answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (response := await answers.get()) is not None:
                yield response
            await reader  # its errors, if any
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _stream_one(
        self, request: pb.ModelInferRequest, caller: Caller, context: grpc.aio.ServicerContext, request_id: str
    ) -> pb.ModelStreamInferResponse:
        """One request of a stream, admitted, counted and logged as a call of its own; an error is its response."""
        started, status = time.perf_counter(), 500
        admitted = None
        try:
            if caller.quota is not None:
                await caller.quota.charge(requests=1)
            admitted = self.calls.in_flight.enter()
            response = await self._infer(request, caller, context.time_remaining())
            status = 200
            return pb.ModelStreamInferResponse(infer_response=response)
        except ServiceError as e:
            status = e.status
            failed(self.calls, e, "ModelStreamInfer")
            return pb.ModelStreamInferResponse(
                error_message=e.message, infer_response=pb.ModelInferResponse(id=request.id)
            )
        except Exception:
            log.exception("unhandled exception in ModelStreamInfer")
            return pb.ModelStreamInferResponse(
                error_message=INTERNAL_MESSAGE, infer_response=pb.ModelInferResponse(id=request.id)
            )
        finally:
            if admitted is not None:
                admitted.leave()
            self.calls.observe("ModelStreamInfer", status, started, context, request_id, caller.key_id)
