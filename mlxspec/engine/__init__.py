"""The inference engine: model loading, prompts, sampling and generation.

No HTTP lives here. Handlers import only the names exported below: the typed
request/event boundary (:mod:`.types`), what they may ask of the engine
(:class:`EngineProtocol`, answered with the plain snapshots of :mod:`.snapshots`),
the :class:`Engine` that implements it, LoRA adapter folders, specs and the
registry of mounted ones (:mod:`.adapters`), the bounds of a chat template a
request brings (:mod:`.template_sandbox`), and the non-generative forward paths:
decision scoring (:func:`score_answers`) and embeddings (:func:`embed_texts`);
speech to text (:mod:`.audio`: the Whisper service as :class:`TranscriberProtocol`,
its options, results, dictation sessions, audio decoding and their errors);
the engine thread's lease (:class:`EngineLease`).
The configuration's defaults come from here too (the prompt cache's and the
SSD tier's byte budgets, the template sandbox's bounds).
"""

from mlxspec.engine.adapters.files import (
    AdapterFolder,
    find_adapters,
    inside,
    read_folder,
    scan_dirs,
)
from mlxspec.engine.adapters.registry import AdapterLimits, AdapterRegistry
from mlxspec.engine.adapters.spec import NONE as NO_ADAPTER_SPEC
from mlxspec.engine.adapters.spec import AdapterError, parse_spec
from mlxspec.engine.audio import (
    DEFAULT_SESSION_IDLE_S,
    FALLBACK_TEMPERATURES,
    MAX_RATE,
    MIN_AUDIO_S,
    MIN_RATE,
    SAMPLE_RATE,
    AudioDecodeError,
    AudioTooLongError,
    SessionError,
    Sessions,
    SessionsProtocol,
    TakeResult,
    TranscribeOptions,
    TranscriberProtocol,
    VadOptions,
    WhisperModelError,
    WindowDone,
    decode_audio,
    pcm_float32,
)
from mlxspec.engine.caches.kv_scheme import KV_QUANT_MODES, KvOptions, KvQuantError
from mlxspec.engine.caches.prompt_cache import DEFAULT_PROMPT_CACHE_BYTES
from mlxspec.engine.caches.ssd_cache import DEFAULT_SSD_CACHE_BYTES, FLUSH_TIMEOUT_S
from mlxspec.engine.embedding import Embeddings, embed_texts
from mlxspec.engine.engine import Engine, RequestHandle
from mlxspec.engine.interface import EngineProtocol
from mlxspec.engine.lease import EngineLease
from mlxspec.engine.loop.admission import (
    AdmissionLimits,
    BudgetTooSmallError,
    ContextBudgetError,
    QueueFullError,
)
from mlxspec.engine.media import FetchPolicy
from mlxspec.engine.model.fit import ModelMemory
from mlxspec.engine.model.loader import cache_dir
from mlxspec.engine.prompt import off_loop, template_off_loop, token_prompt
from mlxspec.engine.sampling.sampler import GenerationDefaults
from mlxspec.engine.scoring import ScoredAnswers, score_answers
from mlxspec.engine.snapshots import ChatFormat, FitSnapshot, StatsSnapshot
from mlxspec.engine.speculative import FILL_MODES, SpeculationError, SpeculationOptions
from mlxspec.engine.template_sandbox import (
    DEFAULT_TEMPLATE_SECONDS,
    DEFAULT_TEMPLATE_STEPS,
    TemplateBoundError,
    TemplateBudget,
    request_template,
)
from mlxspec.engine.types import (
    Cancelled,
    Constraint,
    ContextLengthError,
    Delta,
    EngineRequestError,
    Event,
    Failed,
    Fill,
    Finished,
    GenerationRequest,
    JobAbandoned,
    LogitsParams,
    MediaInputs,
    MediaPrompt,
    ModelInfo,
    PromptError,
    SamplingParams,
    Speculation,
    TokenLogprob,
    TopLogprob,
)

__all__ = [
    "DEFAULT_SESSION_IDLE_S",
    "FALLBACK_TEMPERATURES",
    "MAX_RATE",
    "MIN_AUDIO_S",
    "MIN_RATE",
    "SAMPLE_RATE",
    "AudioDecodeError",
    "AudioTooLongError",
    "JobAbandoned",
    "SessionError",
    "Sessions",
    "SessionsProtocol",
    "TakeResult",
    "TranscribeOptions",
    "TranscriberProtocol",
    "VadOptions",
    "WhisperModelError",
    "WindowDone",
    "decode_audio",
    "pcm_float32",
    "AdapterError",
    "AdapterFolder",
    "AdapterLimits",
    "AdapterRegistry",
    "NO_ADAPTER_SPEC",
    "find_adapters",
    "inside",
    "parse_spec",
    "read_folder",
    "scan_dirs",
    "AdmissionLimits",
    "BudgetTooSmallError",
    "ContextBudgetError",
    "QueueFullError",
    "DEFAULT_PROMPT_CACHE_BYTES",
    "DEFAULT_SSD_CACHE_BYTES",
    "DEFAULT_TEMPLATE_SECONDS",
    "DEFAULT_TEMPLATE_STEPS",
    "FLUSH_TIMEOUT_S",
    "EngineLease",
    "Cancelled",
    "ChatFormat",
    "Constraint",
    "ContextLengthError",
    "Delta",
    "Embeddings",
    "Engine",
    "EngineProtocol",
    "EngineRequestError",
    "Event",
    "Failed",
    "FitSnapshot",
    "Finished",
    "GenerationDefaults",
    "GenerationRequest",
    "LogitsParams",
    "MediaInputs",
    "MediaPrompt",
    "FetchPolicy",
    "ModelInfo",
    "ModelMemory",
    "PromptError",
    "RequestHandle",
    "SamplingParams",
    "Speculation",
    "Fill",
    "FILL_MODES",
    "SpeculationError",
    "KV_QUANT_MODES",
    "KvOptions",
    "KvQuantError",
    "SpeculationOptions",
    "ScoredAnswers",
    "StatsSnapshot",
    "TemplateBoundError",
    "TemplateBudget",
    "TokenLogprob",
    "TopLogprob",
    "cache_dir",
    "embed_texts",
    "off_loop",
    "request_template",
    "score_answers",
    "template_off_loop",
    "token_prompt",
]
