"""The request and response bodies of rmscore's own HTTP route, /rmscore/v1/score (docs/contract.md).

Kept apart from the app, as vLLM keeps its protocol models apart from its serving code: the
schema is what clients see, the app is how it is served. The framework routes' schemas live
beside their routes (`vllm_protocol.py`, `openrlhf.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidatorFunctionWrapHandler, WrapValidator

from rmscore.core.validation import SeqInput
from rmscore.frontends.body_lists import list_of
from rmscore.frontends.json_body import OverLongIds


def _ids_or_over_long(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """The array decoding left undecoded for its length (json_body.py) as `OverLongIds`, which
    the validator refuses by that length; any other value validated, and refused, as before."""
    over_long = OverLongIds.parse(value)
    return handler(value) if over_long is None else over_long


class SequenceIn(BaseModel):
    """One sequence: `tokens` (ids) or `prompt` + `response` (text)."""

    model_config = ConfigDict(extra="forbid")
    # Strict: "101", 101.0 and true are not token ids (lax mode read them as 101, 101, 1).
    tokens: Annotated[list_of(StrictInt, None) | None, WrapValidator(_ids_or_over_long)] = None
    prompt: str | None = None
    response: str | None = None

    def seq_input(self) -> SeqInput:
        """The core's input. Both kept when both are sent: the validator refuses that rather than
        letting tokens win."""
        has_text = self.prompt is not None or self.response is not None
        text = (self.prompt or "", self.response or "") if has_text else None
        return SeqInput(tokens=self.tokens, text=text)


class ScoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sequences: list_of(SequenceIn)
    truncation: Literal["none", "left", "right"] = "none"
    timeout_ms: float | None = Field(default=None, gt=0, description="deadline for this request")


class TimingsOut(BaseModel):
    total_ms: float
    inference_ms: float
    queue_ms: float


class ScoreOut(BaseModel):
    scores: list[float]
    model_version: str
    timings: TimingsOut
