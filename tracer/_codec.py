"""Former home of the step's wire form, kept so older imports keep working: see `tracer.wire`."""

from gradscape.tracer.wire import (
    MAX_ARRAY_ELEMENTS,
    WIRE_VERSION,
    TraceFormatError,
    decode_array,
    encode_array,
    pack,
    step_from_wire,
    step_to_wire,
    tensor_from_wire,
    tensor_to_wire,
    unpack,
)

__all__ = ["MAX_ARRAY_ELEMENTS", "WIRE_VERSION", "TraceFormatError", "decode_array", "encode_array", "pack",
           "step_from_wire", "step_to_wire", "tensor_from_wire", "tensor_to_wire", "unpack"]
