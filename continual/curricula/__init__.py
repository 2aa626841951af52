"""Curricula: modification factories that map the global step to a modification string.

The guide to the factory contract; `modification_factories.py` at the top of the repository is the short file you
edit to add your own.

A *modification factory* maps the training global step (agent steps summed over
all parallel environments) to a *modification string*: space-separated
modification names such as ``"all_green_cars reverse_car_speed_top"`` (for the
Gymnasium backend tokens look like ``"gravity=12.0 length=0.7"``), or ``""`` for
the unmodified game. Whenever the string for the current step differs from the
previous one, the training loop switches the environments.

Modification strings
--------------------
Every string a factory emits or lists is normalised by
:func:`normalize_modification`: split on whitespace, empty tokens dropped,
duplicates removed, tokens sorted, joined with single spaces (``""`` for none).
So ``" b  a a"`` becomes ``"a b"``. Tokens are never interpreted, so conflicting
tokens such as ``"gravity=1 gravity=2"`` are both kept.

Steps, decisions and granularity
--------------------------------
The training loop asks the factory at the start of each rollout. Each factory
takes a keyword-only ``granularity`` (default 1; training uses 1 for built-in
curricula, see "Granularity in training") and counts everything in *decisions*:
decision ``d`` covers the steps ``[d * granularity, (d + 1) * granularity)``.

Quantisation rule (all factories): the string at step ``s`` is the factory's
rule evaluated at the decision start ``(s // granularity) * granularity``. A
switch therefore happens at the first decision boundary at or after a
threshold / phase end, and the string is constant within a decision. Random
draws and ``num_repetitions`` are counted in decisions, never in steps or calls.

``get_modification(step)`` is a pure function of (constructor arguments, seed,
granularity, step): it does not depend on call history, may be called in any
order, and is O(1) amortised. It is defined for ``0 <= step < total_timesteps``
and raises ``ValueError`` outside. Randomness comes only from a private numpy
RNG derived from ``seed`` (``np.random.SeedSequence``; random numbers are
generated lazily in fixed-size chunks of decisions), never from the global
``np.random`` / ``random`` state. The same seed gives the same schedule,
different seeds give different random schedules.

Built-in factories (also registered under the short alias without the
``ModificationFactory`` suffix, e.g. ``"Sequential"``)
----------------------------------------------------------------------------
``NoModificationFactory(num_total_steps)``
    Always ``""``. Also registered as ``"NoModification"``.

``SequentialModificationFactory(num_total_steps, modifications, switching_thresholds)``
    ``modifications[i]`` is active on ``[thr[i-1], thr[i])`` with ``thr[-1] = 0``
    and ``thr[len] = num_total_steps``. ``switching_thresholds`` must have
    ``len(modifications) - 1`` strictly increasing entries, each in
    ``(0, num_total_steps)`` (so one modification takes ``[]``).

``EpsSequentialModificationFactory(..., epsilon=0.05)``
    Like Sequential, but at each decision, with probability ``epsilon``, if the
    current entry index ``idx > 0`` a uniformly chosen earlier entry
    (index ``< idx``) is returned for that decision only. The first entry never
    replays. ``epsilon`` in ``[0, 1]``.

``RandomModificationFactory(num_total_steps, modifications, probabilities=None, num_repetitions=1)``
    Decisions are grouped in blocks ``b = d // num_repetitions``; every block,
    including the first, draws one modification with ``probabilities`` (uniform
    if ``None``), held for exactly ``num_repetitions`` decisions (the last block
    may be cut short by the end). Probabilities: same length as
    ``modifications``, each finite and ``>= 0``, summing to 1 within 1e-6.
    Duplicate entries are allowed.

``AllCombinationsRandomModificationFactory(num_total_steps, modifications, probabilities=None, num_repetitions=1)``
    Random over the normalised join of every element of
    ``itertools.product(*modifications)`` (in product order). Each factor is a
    non-empty list of strings; ``""`` factors are allowed and vanish.
    ``probabilities`` is over the joint product (length = product of factor
    sizes; at most 1,000,000 combinations).

``CombinedModificationFactory(modification_factory_kwargs)``
    Phases run back to back: phase ``j`` covers ``[start_j, start_j + total_j)``
    and its sub-factory is evaluated at ``step - start_j`` (after the
    quantisation above, in the parent's step coordinates; a phase containing no
    decision start is skipped). ``modification_factory_kwargs`` is either a dict
    ``{factory_name: kwargs}`` (dict order = phase order) or a list of
    ``{"modification_factory": name, "modification_factory_kwargs": {...}}``
    (one class may then appear in several phases). Sub-factories inherit the
    granularity and get a distinct seed derived from the parent seed and the
    phase index. Nesting is allowed. ``total_timesteps`` is the sum of phases.

``EpsCombinedModificationFactory(modification_factory_kwargs, epsilon=0.05)``
    As Combined, but at each decision in phase ``j > 0``, with probability
    ``epsilon``, a uniformly random string from the replay pool of phase ``j``
    is returned: the set of strings actually emitted (at decision boundaries)
    by phases ``0..j-1`` without this factory's own replay. Phase 0, or a phase
    whose pool is empty, never replays.

``TaskSequenceModificationFactory(tasks, cycles=1)`` (alias ``"TaskSequence"``)
    CORA-style task sequences: ``tasks`` is a list of ``{"env_id": ..., "modifications": ..., "steps": N}``
    run in order, the whole list ``cycles`` times; a task's string is ``env=<env_id> <modifications>``
    (a task without ``env_id`` runs ``--env_id``). ``total_timesteps = cycles * sum(steps)``. See
    ``continual.curricula.tasks``.

Your own factory: the seed's contract
-------------------------------------
A plain class (no base class needed) with ``__init__(num_total_steps, **kwargs)`` and
``get_modification(step) -> str``, registered with
``modification_factory_mapping["MyFactory"] = MyFactory`` (the same dict as
:data:`FACTORIES`) or named by import path, is run by :class:`CallReplayFactory`:
it is asked once per decision, at steps ``0, g, 2g, ...`` in this order, and its
answers are recorded, so it may keep state (count calls) and draw from the global
``random`` / ``np.random`` (a private state seeded from the run's seed is swapped
in around each call). A resumed run replays the calls from step 0 and so
continues the same schedule. The same holds for a ``ModificationFactory``
subclass that overrides ``get_modification`` instead of ``modification_at``.

Granularity in training (:func:`make_run_factory`)
---------------------------------------------------
A curriculum of built-in factories is built with granularity 1: thresholds,
phase lengths and ``num_repetitions`` count agent steps, so one config is one
schedule under every agent and rollout size; the agent switches at the first
rollout start at or after a switch. A curriculum containing your own factory is
built with the agent's rollout size as granularity (asked once per rollout).

Public API
----------
``normalize_modification``, ``FactoryConfigError``, ``ModificationFactory``
(``get_modification``, ``total_timesteps``, ``seed``, ``granularity``,
``possible_modifications``, ``schedule``/``iter_schedule``, ``state_dict``,
``load_state_dict``, ``config``; hooks ``modification_at``, ``make_rng``,
``decision_index``), the seven factories above (Combined also exposes
``phases``/``phase_starts``, EpsCombined ``replay_pools``), ``FACTORIES``,
``modification_factory_mapping``, ``register_factory``, ``get_factory_class``,
``make_factory``, ``CallReplayFactory``, ``make_run_factory``, ``uses_user_code``,
``granularity_rule`` and ``main``.

``possible_modifications()`` is the support: every string emitted with
probability > 0 over seeds (entries with probability 0, entries/phases that
contain no decision start, and, with ``epsilon == 1``, entries that always
replay are excluded).

Configuration, errors and the registry
--------------------------------------
Factories are built from config with :func:`make_factory` (name, kwargs dict,
seed, granularity). Every invalid argument raises :class:`FactoryConfigError`
(a ``ValueError``) with a one-line message naming the field by a dotted path,
e.g. ``modification_factory_kwargs.switching_thresholds: must be strictly
increasing, got [10, 5]``. Step counts (``num_total_steps``,
``switching_thresholds``) accept integral floats such as ``1e6``; other
integers must be real ints (never bool). ``seed`` and ``granularity`` are
passed separately and may not appear in the kwargs.

:data:`FACTORIES` maps names to classes. Decorate your own subclass with
:func:`register_factory` to make it available by name, or refer to it with an
import path ``"package.module:ClassName"`` / ``"path/to/file.py:ClassName"``.
A user factory calls ``super().__init__(num_total_steps, seed=seed,
granularity=granularity, _path=_path)`` and implements
``modification_at(step)`` (the rule at a decision start, local step); it may
use ``self.make_rng(...)`` for private randomness and override
``possible_modifications``/``state_dict``/``load_state_dict`` if it has real
state.

Checkpoints
-----------
``state_dict()`` holds plain types only (safe for
``torch.load(weights_only=True)``): factory name, canonical kwargs, seed,
granularity and total steps. Since factories are pure, ``load_state_dict``
only verifies that these match the current factory and raises
``FactoryConfigError`` naming every difference, so a resumed run provably
continues the same schedule.

Preview
-------
``python modification_factories.py CONFIG.json [--granularity N] [--seed S]
[--max-rows N]`` prints the run-length-encoded schedule of the config's
``modification_factory`` / ``modification_factory_kwargs``. Granularity
defaults to ``num_envs * num_steps`` from the config (else 8 * 128 = 1024),
the seed to the config's ``seed`` (else 1). Bad input prints one
``error: ...`` line to stderr and exits with status 2.
"""

from continual.curricula.base import FACTORIES, FactoryConfigError, ModificationFactory, normalize_modification
from continual.curricula.builtin import (
                                         SCHEDULE_GRANULARITY,
                                         AllCombinationsRandomModificationFactory,
                                         CombinedModificationFactory,
                                         EpsCombinedModificationFactory,
                                         EpsSequentialModificationFactory,
                                         NoModificationFactory,
                                         RandomModificationFactory,
                                         SequentialModificationFactory,
                                         granularity_rule,
                                         make_run_factory,
                                         uses_user_code,
)
from continual.curricula.preview import main
from continual.curricula.registry import (
                                         CallReplayFactory,
                                         get_factory_class,
                                         make_factory,
                                         modification_factory_mapping,
                                         register_factory,
)
from continual.curricula.tasks import TaskSequenceModificationFactory, task_string

__all__ = [
    "FACTORIES", "CallReplayFactory", "SCHEDULE_GRANULARITY", "granularity_rule", "make_run_factory",
    "modification_factory_mapping", "uses_user_code", "AllCombinationsRandomModificationFactory",
    "CombinedModificationFactory", "EpsCombinedModificationFactory", "EpsSequentialModificationFactory",
    "FactoryConfigError", "ModificationFactory", "NoModificationFactory", "RandomModificationFactory",
    "SequentialModificationFactory", "get_factory_class", "main", "make_factory", "normalize_modification",
    "register_factory", "TaskSequenceModificationFactory", "task_string",
]
