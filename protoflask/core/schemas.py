"""The marshmallow schemas of the envelope and of every client payload (docs/PROTOCOL.md
§2, §4): the definition of what is valid, and the wording of every validation error.

Built once at import. Extra envelope fields are excluded and extra payload fields are
kept, so newer clients stay compatible. envelope.py runs them (after its fast checks).
"""

from __future__ import annotations

from typing import Any

from marshmallow import EXCLUDE, INCLUDE, Schema, ValidationError, fields, validate

from .wire import (
    CHANNELS, CLIENT_TYPES, DECIMAL, MAX_DIGITS, MAX_NONCE_LENGTH, MAX_SEQ, MAX_VALIDATION_ERRORS,
    NON_NEGATIVE_INT, POSITIVE_INT, SEQ_ERROR, VERSION,
)

# -- field types ---------------------------------------------------------------------------


class SeqField(fields.Field[int]):
    """A seq number in a payload: a decimal string or an int (docs/PROTOCOL.md §2) -> int."""

    def __init__(self, *, allow_zero: bool = True, **kwargs: Any) -> None:
        self.allow_zero = allow_zero
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool):
            raise ValidationError("must be a decimal string or an integer")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and NON_NEGATIVE_INT.match(value):
            number = int(value)
        else:
            raise ValidationError(f"{SEQ_ERROR}, or an integer")
        if number < 0 or (number == 0 and not self.allow_zero):
            raise ValidationError("must be a positive number")
        if number > MAX_SEQ:
            raise ValidationError(f"must be at most {MAX_SEQ} (2^53-1)")
        return number


class StrictInt(fields.Integer):
    """An integer that refuses booleans and strings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _validated(self, value: Any) -> int:
        if isinstance(value, bool):
            raise self.make_error("invalid")
        return super()._validated(value)


class BoundedList(fields.List[Any]):
    """A list whose validation stops after MAX_VALIDATION_ERRORS bad elements (marshmallow's
    List checks and reports every one)."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.make_error("invalid")
        result: list[Any] = []
        errors: dict[Any, Any] = {}
        for idx, each in enumerate(value):
            try:
                result.append(self.inner.deserialize(each, **kwargs))
            except ValidationError as error:
                errors[idx] = error.messages
                if len(errors) >= MAX_VALIDATION_ERRORS and idx + 1 < len(value):
                    errors["more"] = (f"validation stopped after {MAX_VALIDATION_ERRORS} "
                                      f"errors; the list has {len(value)} elements")
                    break
        if errors:
            raise ValidationError(errors, valid_data=result)
        return result


def _seq_string(value: str) -> None:
    if not POSITIVE_INT.match(value) or int(value) > MAX_SEQ:
        raise ValidationError(f"must be a positive decimal string of a number of at most "
                              f"{MAX_SEQ} (2^53-1)")


def _required_str(**kwargs: Any) -> fields.String:
    return fields.String(required=True, validate=validate.Length(min=1), **kwargs)


def _channel(**kwargs: Any) -> fields.String:
    return fields.String(validate=validate.OneOf(CHANNELS), **kwargs)


class _Payload(Schema):
    class Meta:
        unknown = INCLUDE


# -- envelope --------------------------------------------------------------------------------


class EnvelopeSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    id = _required_str()
    session = fields.String(required=True)
    seq = fields.String(required=True, validate=_seq_string)
    ts = fields.String(required=True, validate=validate.Regexp(
        DECIMAL, error=f"must be a decimal string of at most {MAX_DIGITS} digits"))
    type = fields.String(required=True)
    channel = fields.String(required=True, validate=validate.OneOf(CHANNELS))
    payload = fields.Dict(required=True)


# -- payloads (client to server, docs/PROTOCOL.md §4) ---------------------------------


class HelloPayload(_Payload):
    proto_version = fields.String(required=True, validate=validate.Regexp(
        VERSION, error="must look like major.minor.patch"))
    accept_major = BoundedList(StrictInt(), required=True)
    accept_events = BoundedList(fields.String(), load_default=list)
    capabilities = fields.Dict(load_default=dict)


class NoncePayload(_Payload):
    nonce = fields.String(required=True, validate=validate.Length(max=MAX_NONCE_LENGTH))


class MessageStartPayload(_Payload):
    message_id = _required_str()
    content_type = fields.String(required=True)


class MessagePartPayload(_Payload):
    message_id = _required_str()
    content = fields.String(required=True)


class MessageEndPayload(_Payload):
    message_id = _required_str()


class ToolCallPayload(_Payload):
    call_id = _required_str()
    tool = _required_str()
    params = fields.Dict(required=True)
    run_id = fields.String(load_default=None, allow_none=True)


class CallIdPayload(_Payload):
    call_id = _required_str()


class EmptyPayload(_Payload):
    pass


class RunStartedPayload(_Payload):
    run_id = fields.String(load_default=None, allow_none=True, validate=validate.Length(min=1))
    thread_id = fields.String(load_default=None, allow_none=True)
    metadata = fields.Raw(load_default=None, allow_none=True)


class RunFinishedPayload(_Payload):
    run_id = _required_str()
    summary = fields.Raw(load_default=None, allow_none=True)


class RunCancelPayload(_Payload):
    run_id = _required_str()


class AckPayload(_Payload):
    seq = SeqField(required=True)


class FlowUpdatePayload(_Payload):
    channel = _channel(required=True)
    add_messages = StrictInt(load_default=0, validate=validate.Range(min=0))
    add_bytes = StrictInt(load_default=0, validate=validate.Range(min=0))


class ChannelPayload(_Payload):
    channel = _channel(required=True)


class ReplayRequestPayload(_Payload):
    from_seq = SeqField(required=True, allow_zero=False)
    to_seq = SeqField(load_default=None, allow_none=True, allow_zero=False)


class AudioChunkPayload(_Payload):
    message_id = _required_str()
    mime = fields.String(required=True)
    data = fields.String(required=True)
    final = fields.Boolean(load_default=False)


PAYLOAD_SCHEMAS: dict[str, Schema] = {
    "HELLO": HelloPayload(),
    "PING": NoncePayload(),
    "PONG": NoncePayload(),
    "MESSAGE_START": MessageStartPayload(),
    "MESSAGE_PART": MessagePartPayload(),
    "MESSAGE_END": MessageEndPayload(),
    "TOOL_CALL": ToolCallPayload(),
    "TOOL_CANCEL": CallIdPayload(),
    "TOOL_LIST": EmptyPayload(),
    "RUN_STARTED": RunStartedPayload(),
    "RUN_FINISHED": RunFinishedPayload(),
    "RUN_CANCEL": RunCancelPayload(),
    "ACK": AckPayload(),
    "FLOW_UPDATE": FlowUpdatePayload(),
    "PAUSE_CHANNEL": ChannelPayload(),
    "RESUME_CHANNEL": ChannelPayload(),
    "REPLAY_REQUEST": ReplayRequestPayload(),
    "AUDIO_CHUNK": AudioChunkPayload(),
}
assert set(PAYLOAD_SCHEMAS) == CLIENT_TYPES

ENVELOPE_SCHEMA = EnvelopeSchema()
