"""The descriptor pool of the Open Inference Protocol modules (``grpc_service_pb2``,
``model_config_pb2``): their own, not protobuf's default one, because their package is
``inference`` as published, and a process that also loads tritonclient's generated modules
(the export checks parse Triton configs with them) would otherwise hold two different files
defining ``inference.ModelConfig`` in one pool, which protobuf refuses."""
from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
