"""`space_activate`: the UI's `rag-pipeline space activate`. The configured embedder's space is
finished and flipped to, once the gate (ingest/activation_gate.py) has compared it with the active
space on every site's labelled questions. A refusal fails the run with the figures side by side in
its message and metadata; `force: true` switches anyway and records it."""

import dagster as dg

from rag_pipeline.core.answer_quality import QuestionsError
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
from rag_pipeline.ingest.activation_gate import Gate, GateRefused, declared_question_sets
from rag_pipeline.ingest.model_switch import ModelSwitchError, activate


class ActivateConfig(dg.Config):
    force: bool = False     # switch even if the gate refuses (recorded as forced)


def gate_metadata(gate: Gate) -> dict:
    return {
        "compared": dg.MetadataValue.md("\n".join(gate.lines) if gate.lines else "nothing compared (no active space)"),
        "figures": dg.MetadataValue.json(gate.figures()),
        "margin": gate.margin,
        "forced": gate.forced,
    }


@dg.op(out=dg.Out(dg.Nothing), description=(
    "Finish the configured embedder's space and flip search to it, unless it answers a site's labelled "
    "questions worse than the active space by more than SPACE_GATE_MARGIN (config force: switch anyway)."))
def activate_space(context: dg.OpExecutionContext, config: ActivateConfig, postgres: PostgresResource,
                   settings: SettingsResource, embedder: EmbedderResource) -> dg.Output:
    current = settings.get()
    try:
        question_sets = declared_question_sets()
    except QuestionsError as exc:
        raise dg.Failure(description=f"cannot judge the switch: {exc}") from None
    gate = Gate(current, question_sets, current.space_gate_margin, force=config.force)
    with postgres.connect() as conn:
        try:
            active = activate(conn, embedder.get(), gate)
        except GateRefused as exc:
            raise dg.Failure(description=str(exc), metadata=gate_metadata(gate)) from None
        except ModelSwitchError as exc:
            raise dg.Failure(description=str(exc)) from None
    for line in gate.lines:
        context.log.info(line)
    if gate.forced:
        context.log.warning("forced past the gate: recorded in space_activations")
    return dg.Output(None, metadata={"active_space": f"{active.space_id} ({active.model}, {active.dimensions} dims)",
                                     **gate_metadata(gate)})


@dg.job(name="space_activate", tags={"rag/kind": "maintenance"}, description=(
    "Flip search to the configured embedder's space (built with `rag-pipeline space build`), gated on "
    "the sites' labelled questions; config force: true switches past a refusal, recorded."))
def space_activate_job():
    activate_space()
