#!/usr/bin/env python3
"""A gRPC backend for benches/grpc_unary.sh: python3-grpcio's server (its C core speaks the h2 and
gRPC framing), one generic unary method `/bench.Echo/Unary` answering the request's bytes, no protobuf
code generated (raw bytes in and out).

    python3 benches/grpc_backend.py 127.0.0.1:19351
"""
import sys
from concurrent import futures

import grpc


def unary(request, context):
    return request


handler = grpc.method_handlers_generic_handler(
    "bench.Echo",
    {"Unary": grpc.unary_unary_rpc_method_handler(unary, lambda b: b, lambda b: b)},
)
server = grpc.server(
    futures.ThreadPoolExecutor(max_workers=4),
    options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 1000)],
)
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port(sys.argv[1])
server.start()
server.wait_for_termination()
