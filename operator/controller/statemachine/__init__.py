"""The LookaheadPolicy lifecycle as a pure function: what the world looks like -> what to do next.

    Pending -> Preflight -> Launching -> Measuring -> Deciding -> Promoting (wave by wave)
            -> Guarding -> Succeeded
    or RolledBack / NotACandidate / Failed

``reconcile(world)`` reads an ``Observed`` snapshot (the parsed spec, the current status model,
the fleet, the canary/control pair, what was measured for the current phase, and what could not
be read) and returns a ``Plan``: the whole next ``LookaheadPolicyStatus``, the actions to carry
out, events to post, and when to look again (``None``: only when something changes).

Rules that hold in every phase:

* Every piece of progress is in the status (``status.progress``) or in labelled objects, so an
  operator killed at any instant resumes from the next snapshot; every action is idempotent.
* Every wait is bounded: Launching and each wave's rollout by ``promotion.rolloutDeadline``, or
  when it is unset by the fleet's own readiness, at least 10m (``clocks.launch_deadline``), Measuring by ``analysis.deadline``, a wave's or the guard's data by ``analysis.deadline``.
  Each deadline ends in an exact state: nothing promoted, or every promoted Deployment restored.
* What could not be read (``Observed.read_errors``) is data: it shows in the ``MetricsAvailable``
  condition, gives no verdict and no guard pass, and the deadlines above still fire. Missing
  data never promotes.
* Paused means frozen: the load stops, nothing else is done, every clock stops; on resume the
  clocks are shifted by the pause and the interrupted step or guard load starts afresh.
* Which measurement each phase needs is declared in ``core`` (``NEEDS``); the handler reads it.
* A target whose pod template its user edited after the claim (``Target.user_edited``) is left to
  them: recorded in ``status.targets`` (``userEdited``) and the ``TargetsEdited`` condition,
  released (our annotations only), and never promoted or restored again by this rollout; the rest
  of the rollout goes on with the other targets (``left_to_user``, docs/operator.md).

The modules, one job each (lower ones never import higher ones):

* ``user_edits``: which targets are left to their users and which the rollout still acts on (pure);
* ``context``: ``PassContext``, the pass in the making, and the phase-change Event messages;
* ``clocks``: step deadlines, load runs, guard restarts, pause and resume;
* ``leaving``: a pass leaving the targets their users edited to them;
* ``cleanup``: stop, roll back and restore; ``deletion_plan``;
* ``pending``, ``measuring``, ``deciding``, ``promoting``, ``guarding``: the phase handlers;
* ``core``: ``reconcile``, the checks every pass makes, ``NEEDS`` and the phase table.
"""

from __future__ import annotations

from lookahead_operator.controller.statemachine.cleanup import deletion_plan
from lookahead_operator.controller.statemachine.clocks import step_deadline
from lookahead_operator.controller.statemachine.context import transition_message, without_transition
from lookahead_operator.controller.statemachine.core import NEEDS, need, reads_prometheus, reconcile
from lookahead_operator.controller.statemachine.live import watches_live_arms
from lookahead_operator.controller.statemachine.user_edits import (
    edited_now,
    in_play,
    left_to_user,
    recorded_user_edits,
    role_source,
)
from lookahead_operator.controller.world import Target
# what the measurement hands the state machine (PreflightResult: the type of Observed.preflight)
from lookahead_operator.measurement.results import GuardCheck, PreflightResult, StepMeasurement, guard_batch_sizes

__all__ = [
    "NEEDS", "need", "reads_prometheus", "watches_live_arms", "GuardCheck", "PreflightResult", "StepMeasurement", "Target", "deletion_plan", "edited_now",
    "guard_batch_sizes", "in_play", "left_to_user", "recorded_user_edits", "reconcile", "role_source",
    "step_deadline", "transition_message", "without_transition",
]
