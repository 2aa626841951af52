"""One spec per agent: what the rest of the library needs to know about an architecture, in one place.

An `AgentSpec` names the agent's module (its `train` and `make_agent`), the defaults of its own algorithm that differ
from `Args`' (which are CleanRL's Atari PPO), the optional features it supports (validation refuses the others with
one line) and how many agent steps one iteration takes (the curriculum's granularity). Validation, `Args`' defaults,
`training/startup.py`, `envs/backends.py`, the entry points and the docs read `SPECS`; nothing else names an
architecture. Adding an agent is its file under agents/ and its entry here (docs/extending.md).

Defaults resolve as: `Args` < the spec's `defaults` < run_config.json < the command line (or `train()`'s keyword
arguments): a spec default applies only where neither the config nor the command line set the flag.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any, Callable, Mapping

from continual.io import between_markers, update_between_markers

# features an agent may support (validation names the flag that needs one)
BF16 = "bf16"                    # --bf16: the update's forward pass under bfloat16 autocast
COMPILE = "compile"              # --compile, --cudagraphs: the act step and the update's loss compiled (training/accel.py)
HER = "her"                      # --her: goal-conditioned policy with relabelled samples
BOX_ACTIONS = "box_actions"      # continuous (Box) action spaces
NORM_OBS = "norm_obs"            # --norm_obs: running observation standardisation
MLP_NETWORK = "mlp_network"      # --network mlp: separate actor and critic MLPs
PLASTICITY = "plasticity"        # --redo, --l2, --l2_init, --parseval, --reset_layers (continual/plasticity/methods.py)
NETWORK_OPTIONS = "network_options"  # --layer_norm, --activation, --nap (continual/plasticity/networks.py)
EWC = "ewc"                      # --ewc
TRAC = "trac"                    # --trac
SHRINK_PERTURB = "shrink_and_perturb"  # --shrink_and_perturb
DQN_FLAGS = "dqn_flags"          # --double_dqn, --reset_replay_on_switch, --epsilon_rewarm_on_switch, --save_replay_buffer
ACTORS = "actors"                # --num_actors processes share --num_envs envs evenly
CLEAR_REPLAY = "clear_replay"    # a replay buffer of --clear_buffer_frames under <run>/replay (disk checked first)
NEEDS_SWITCHES = "needs_switches"  # the curriculum must switch (per-task phases)
ADAM_BETAS = "adam_betas"        # --adam_beta1, --adam_beta2: the agent trains with Adam
C_CHAIN = "c_chain"              # --c_chain (continual/plasticity/c_chain.py)
FUSED_ADAM = "fused_adam"        # --fused_adam: torch's fused Adam kernel (the same update up to float rounding)
ACT_THREADS = "act_threads"      # --act_threads: torch's threads while a rollout acts
SEEDS_IN_ONE_PROCESS = "seeds_in_one_process"  # agents/dqn_seeds.py: the launcher's seeds_per_process
# flags agents/dqn_seeds.py (several DQN seeds in one process; the launcher's seeds_per_process) requires at their
# defaults: their methods act on one network per hook call
NOT_BATCHED_ACROSS_SEEDS = ("shrink_and_perturb", "reset_optimizer_on_switch", "redo", "parseval", "layer_norm",
                            "activation", "reset_layers", "nap", "plasticity_injection")

FEATURES = (BF16, COMPILE, HER, BOX_ACTIONS, NORM_OBS, MLP_NETWORK, PLASTICITY, NETWORK_OPTIONS, EWC, TRAC,
            SHRINK_PERTURB, DQN_FLAGS, ACTORS, CLEAR_REPLAY, NEEDS_SWITCHES, ADAM_BETAS, C_CHAIN, FUSED_ADAM,
            ACT_THREADS, SEEDS_IN_ONE_PROCESS)


def rollout_steps(args: Any) -> int:
    """num_envs x num_steps: a rollout (PPO, A2C) or a logging iteration (DQN)."""
    return args.num_envs * args.num_steps


def learner_batch_steps(args: Any) -> int:
    """batch_size unrolls of unroll_length steps of one actor's envs: one learner update (IMPALA's family)."""
    return args.batch_size * args.unroll_length * (args.num_envs // args.num_actors)


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    name: str
    """the --architecture value"""
    module: str
    """the agent file's module (has `train(args, curriculum, resume_state)` and `make_agent(obs_space,
    action_space, args)`)"""
    summary: str
    """one line for the docs"""
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """flags whose default differs from Args' for this algorithm (where neither config nor command line set them)"""
    features: frozenset = frozenset()
    """the optional features (above) it supports"""
    steps_per_iteration: Callable[[Any], int] = rollout_steps
    """agent steps per iteration: the curriculum is asked once per iteration"""

    def supports(self, feature: str) -> bool:
        return feature in self.features


_PPO_FEATURES = frozenset({BF16, HER, BOX_ACTIONS, NORM_OBS, PLASTICITY, EWC, SHRINK_PERTURB, ADAM_BETAS, C_CHAIN,
                           ACT_THREADS})
# IMPALA's family sums its losses over the batch: TorchBeast's clip of 40 (0.5 shrinks its updates ~100x) and
# cleanba's learning rate (configs/impala_freeway.json)
_IMPALA_DEFAULTS = {"learning_rate": 6e-4, "max_grad_norm": 40.0}

SPECS: dict[str, AgentSpec] = {s.name: s for s in (
    AgentSpec("PPO", "agents.ppo", "CleanRL's ppo_atari (Args' defaults are its values)",
              features=_PPO_FEATURES | {COMPILE, MLP_NETWORK, NETWORK_OPTIONS, TRAC, FUSED_ADAM}),
    AgentSpec("PPO_CBP", "agents.ppo_cbp", "PPO with continual backpropagation (Dohare et al. 2024)",
              features=_PPO_FEATURES),
    AgentSpec("IMPALA", "agents.impala", "IMPALA with V-trace, actor processes and a learner (TorchBeast)",
              defaults=_IMPALA_DEFAULTS, steps_per_iteration=learner_batch_steps,
              features=frozenset({MLP_NETWORK, PLASTICITY, NETWORK_OPTIONS, EWC, SHRINK_PERTURB, ACTORS})),
    AgentSpec("CLEAR", "agents.clear", "IMPALA + CLEAR's replay with behaviour cloning (Rolnick et al. 2019)",
              defaults=_IMPALA_DEFAULTS, steps_per_iteration=learner_batch_steps,
              features=frozenset({MLP_NETWORK, PLASTICITY, NETWORK_OPTIONS, SHRINK_PERTURB, ACTORS, CLEAR_REPLAY})),
    AgentSpec("PNC", "agents.pnc", "Progress & Compress on IMPALA (Schwarz et al. 2018)",
              defaults=_IMPALA_DEFAULTS, steps_per_iteration=learner_batch_steps,
              features=frozenset({ACTORS, NEEDS_SWITCHES})),
    AgentSpec("DQN", "agents.dqn", "CleanRL's dqn_atari (Adam 1e-4 constant, one env, 1M replay)",
              defaults={"learning_rate": 1e-4, "anneal_lr": False, "num_envs": 1},
              features=frozenset({PLASTICITY, NETWORK_OPTIONS, SHRINK_PERTURB, DQN_FLAGS, C_CHAIN, FUSED_ADAM,
                                  SEEDS_IN_ONE_PROCESS})),
    AgentSpec("A2C", "agents.a2c", "synchronous A2C as baselines/SB3 (16 envs x 5 steps, RMSprop 7e-4)",
              defaults={"learning_rate": 7e-4, "num_envs": 16, "num_steps": 5, "gae_lambda": 1.0, "norm_adv": False,
                        "vf_coef": 0.25, "rmsprop_eps": 1e-5},
              features=frozenset({NORM_OBS, MLP_NETWORK, SHRINK_PERTURB})),
)}

ARCHITECTURES = tuple(SPECS)
DEFAULT_GRAD_CLIP = 0.5  # losses that are means over the batch (PPO, A2C; DQN does not clip)


def spec_of(architecture: str) -> AgentSpec:
    return SPECS[architecture]


def supporting(feature: str) -> list[str]:
    """The architectures that support `feature`, in SPECS' order (for error messages)."""
    return [name for name, s in SPECS.items() if feature in s.features]


def names_of(architectures: list[str]) -> str:
    """'A', 'A and B', 'A, B and C'."""
    return architectures[0] if len(architectures) == 1 else f"{', '.join(architectures[:-1])} and {architectures[-1]}"


def _flag(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {value}"


def defaults_line(architecture: str) -> str:
    """The architecture's own defaults as flags, on one line (its --help and its file's docstring)."""
    own = " ".join(_flag(k, v) for k, v in SPECS[architecture].defaults.items())
    return f"its own defaults: {own}" if own else "its defaults are Args' (CleanRL's ppo_atari)"


# an agent file's docstring ends with its spec, between these lines (`python -m continual.specs --update-docs`)
AGENT_START, AGENT_END = "Spec (continual/specs.py):", "(generated: python -m continual.specs --update-docs)"


def agent_file(architecture: str) -> str:
    return SPECS[architecture].module.replace(".", "/") + ".py"


def agent_block(architecture: str) -> str:
    s = SPECS[architecture]
    supports = textwrap.fill(", ".join(sorted(s.features)) or "(no optional feature)", 116,
                             initial_indent="- supports: ", subsequent_indent="  ")
    return f"- {defaults_line(architecture)}\n{supports}\n"


def defaults_markdown() -> str:
    """The docs' table of each architecture's own defaults (generated, like the flag reference)."""
    def flag(name: str, value: Any) -> str:
        return f"`{_flag(name, value)}`"

    rows = ["| architecture | what | defaults that differ from the flag reference | steps per iteration |",
            "|---|---|---|---|"]
    for s in SPECS.values():
        own = ", ".join(flag(k, v) for k, v in s.defaults.items()) or "(none)"
        rows.append(f"| `{s.name}` (`{s.module}`) | {s.summary} | {own} | "
                    f"{s.steps_per_iteration.__doc__.split(':')[0]} |")
    return "\n".join(rows) + "\n"


DOCS_START, DOCS_END = "<!-- specs:start -->", "<!-- specs:end -->"


def docs_with_defaults(text: str) -> str:
    return between_markers(text, DOCS_START, DOCS_END, defaults_markdown())


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--update-docs"]:  # python -m continual.specs --update-docs
        update_between_markers("docs/extending.md", DOCS_START, DOCS_END, defaults_markdown())
        for name in SPECS:
            update_between_markers(agent_file(name), AGENT_START, AGENT_END, agent_block(name))
    else:
        print(defaults_markdown(), end="")
