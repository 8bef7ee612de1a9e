"""The inference engine: model loading, prompts, sampling and generation.

No HTTP lives here. Handlers import only the names exported below: the typed
request/event boundary (:mod:`.types`), the :class:`Engine` and model
resolution (:mod:`.loader`), LoRA adapter folders and specs (:mod:`.adapters`),
the bounds of a chat template a request brings (:mod:`.template_sandbox`), and
the non-generative forward paths: decision scoring (:func:`score_answers`) and
embeddings (:func:`embed_texts`).
"""

from mlxspec.engine.adapters.files import (
    AdapterFolder,
    find_adapters,
    inside,
    read_folder,
    scan_dirs,
)
from mlxspec.engine.adapters.registry import AdapterRegistry
from mlxspec.engine.adapters.spec import NONE as NO_ADAPTER_SPEC
from mlxspec.engine.adapters.spec import AdapterError, parse_spec
from mlxspec.engine.caches.ssd_cache import FLUSH_TIMEOUT_S
from mlxspec.engine.embedding import Embeddings, embed_texts
from mlxspec.engine.engine import Engine, RequestHandle
from mlxspec.engine.loop.admission import (
    AdmissionLimits,
    BudgetTooSmallError,
    ContextBudgetError,
    QueueFullError,
)
from mlxspec.engine.prompt import off_loop, template_off_loop, token_prompt
from mlxspec.engine.sampling.sampler import GenerationDefaults
from mlxspec.engine.scoring import ScoredAnswers, score_answers
from mlxspec.engine.template_sandbox import TemplateBoundError, TemplateBudget, request_template
from mlxspec.engine.types import (
    Cancelled,
    Constraint,
    ContextLengthError,
    Delta,
    EngineRequestError,
    Event,
    Failed,
    Finished,
    GenerationRequest,
    LogitsParams,
    ModelInfo,
    PromptError,
    SamplingParams,
    TokenLogprob,
    TopLogprob,
)

__all__ = [
    "AdapterError",
    "AdapterFolder",
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
    "FLUSH_TIMEOUT_S",
    "Cancelled",
    "Constraint",
    "ContextLengthError",
    "Delta",
    "Embeddings",
    "Engine",
    "EngineRequestError",
    "Event",
    "Failed",
    "Finished",
    "GenerationDefaults",
    "GenerationRequest",
    "LogitsParams",
    "ModelInfo",
    "PromptError",
    "RequestHandle",
    "SamplingParams",
    "ScoredAnswers",
    "TemplateBoundError",
    "TemplateBudget",
    "TokenLogprob",
    "TopLogprob",
    "embed_texts",
    "off_loop",
    "request_template",
    "score_answers",
    "template_off_loop",
    "token_prompt",
]
