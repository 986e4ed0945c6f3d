"""The LLM generation pipeline (paper §3.1).

Persona -> questions with required info -> merged state schema -> initial state -> per-period
validated updates and life events -> opening messages with an exposure check -> personalised answers
per state variant with a reflection check.

Entry point: `run_pipeline(load_config(path), out_dir, ChatClient(...))`; every step of every
user is saved under out_dir/raw/<user_id>/<step>.json, so a rerun resumes where it stopped.
"""

from memloop.environment.llm_pipeline.config import BUILTIN_PERSONAS, PipelineConfig, load_config
from memloop.environment.llm_pipeline.personas import Persona, load_personas, select_personas
from memloop.environment.llm_pipeline.runner import (
    GenerationIncomplete,
    PipelineResult,
    UserFailure,
    run_pipeline,
    steps_per_user,
)

__all__ = [
    "BUILTIN_PERSONAS",
    "GenerationIncomplete",
    "Persona",
    "PipelineConfig",
    "PipelineResult",
    "UserFailure",
    "load_config",
    "load_personas",
    "run_pipeline",
    "select_personas",
    "steps_per_user",
]
