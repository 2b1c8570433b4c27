"""Fuzz target: the Python gRPC front end's decoding and validation.

Bytes are decoded as the wire form of a ScoreRequest (the Score RPC) and of a
ScoreStreamRequest (one ScoreStream item), then put through exactly what
rmscore.frontends.grpc_server does with a decoded message before queueing it:
`seq_input` + the truncation mapping + the core's validator. Seeds: corpus/py_grpc/.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from fuzz_common import check_refusal, check_sequences, core, main


def one_input(data: bytes) -> None:
    from rmscore.core.errors import ScoreError
    from rmscore.frontends.grpc_server import TRUNC, seq_input
    from rmscore_client.v1 import reward_pb2

    validator = core().validator
    try:
        req = reward_pb2.ScoreRequest.FromString(data)
    except DecodeError:
        req = None  # grpc answers INTERNAL "failed to parse" before the servicer runs
    if req is not None:
        items = [seq_input(s) for s in req.sequences]
        try:
            seqs = validator.request(items, TRUNC.get(req.truncation, "none"))
        except ScoreError as e:
            check_refusal(e)
        else:
            check_sequences(seqs, len(items))
    try:
        item = reward_pb2.ScoreStreamRequest.FromString(data)
    except DecodeError:
        return
    try:
        seq = validator.sequence(seq_input(item.sequence), TRUNC.get(item.truncation, "none"), "sequence")
    except ScoreError as e:
        check_refusal(e)
    else:
        check_sequences([seq], 1)


if __name__ == "__main__":
    main(one_input)
