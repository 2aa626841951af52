"""Checks on a resolved configuration that types alone cannot express: ranges, combinations, and what the chosen
env allows (its action space, a goal space for --her). Each problem is one UserError naming the field."""

from __future__ import annotations

import math
import shutil

import torch

from continual import specs
from continual.config.args import Args, default_args
from continual.envs.backends import backend_hint, validate_action_space
from continual.envs.goals import make_goal_space
from continual.envs.minihack import validate_obs_mode
from continual.envs.vector import batched_blocker
from continual.errors import UserError
from continual.specs import SPECS, names_of, supporting


def require(args: Args, feature: str, flag: str) -> None:
    """One line naming the flag when the architecture's spec (continual/specs.py) lacks `feature`."""
    if not SPECS[args.architecture].supports(feature):
        names = supporting(feature)
        if len(names) == 1:
            raise UserError(f"{flag}: only used with --architecture {names[0]}, not {args.architecture}")
        raise UserError(f"{flag}: supported by {names_of(names)}, not {args.architecture}")


def check_batched_across_seeds(args: Args) -> None:
    """agents/dqn_seeds.py (the launcher's seeds_per_process) batches seeds only with specs.NOT_BATCHED_ACROSS_SEEDS at
    their defaults: one line naming the first that is not."""
    ref = default_args(args.architecture)
    changed = [f for f in specs.NOT_BATCHED_ACROSS_SEEDS if getattr(args, f) != getattr(ref, f)]
    if changed:
        raise UserError(f"{changed[0]}: not batched across seeds; run agents/dqn.py once per seed")


def validate_args(args: Args) -> None:
    """Range checks that types alone cannot express."""

    def positive(name: str) -> None:
        if getattr(args, name) <= 0:
            raise UserError(f"{name}: must be positive, got {getattr(args, name)}")

    def in_unit(name: str, low_open: bool = False) -> None:
        v = getattr(args, name)
        if not (math.isfinite(v) and 0.0 <= v <= 1.0) or (low_open and v == 0):
            raise UserError(f"{name}: must be in {'(0' if low_open else '[0'}, 1], got {v}")

    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "frameskip", "buffer_window_size",
                 "keep_checkpoints"):
        positive(name)
    if args.envs_per_worker < 0:
        raise UserError(f"envs_per_worker: must be 0 (spread over the cores) or positive, got {args.envs_per_worker}")
    if args.video_every < 0:
        raise UserError(f"video_every: must be 0 (capped cubic schedule) or positive, got {args.video_every}")
    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        v = getattr(args, name)
        if v is None and name == "max_grad_norm":  # the architecture's default (Args.grad_clip_norm)
            continue
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"{name}: must be a positive finite number, got {v}")
    for name in ("ent_coef", "vf_coef"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name}: must be a non-negative finite number, got {v}")
    for name in ("gamma", "gae_lambda", "repeat_action_probability"):
        in_unit(name)
    for name in ("noop_max", "checkpoint_every"):
        if getattr(args, name) < 0:
            raise UserError(f"{name}: must be >= 0, got {getattr(args, name)}")
    if not (math.isfinite(args.checkpoint_minutes) and args.checkpoint_minutes >= 0):
        raise UserError(f"checkpoint_minutes: must be a non-negative finite number, got {args.checkpoint_minutes}")
    for name in ("num_actors", "unroll_length", "batch_size", "broadcast_interval", "max_in_flight"):
        positive(name)
    if args.actor_max_restarts < 0:
        raise UserError(f"actor_max_restarts: must be >= 0, got {args.actor_max_restarts}")
    validate_actor_backend(args)
    for name in ("replacement_rate", "shrink_factor", "decay_rate"):
        in_unit(name)
    for name in ("noise_scale", "dormant_tau", "vtrace_rho_bar", "vtrace_c_bar", "rmsprop_eps"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name}: must be a non-negative finite number, got {v}")
    for name in ("maturity_threshold", "diagnostics_every"):
        if getattr(args, name) < 0:
            raise UserError(f"{name}: must be >= 0, got {getattr(args, name)}")
    if not 0 < args.rmsprop_alpha < 1:
        raise UserError(f"rmsprop_alpha: must be in (0, 1), got {args.rmsprop_alpha}")
    for name in ("adam_beta1", "adam_beta2"):
        v = getattr(args, name)
        if not 0 <= v < 1:  # also refuses nan
            raise UserError(f"{name}: must be in [0, 1), got {v}")
        if v != getattr(Args, name):  # Args' default: the optimizer every agent has
            require(args, specs.ADAM_BETAS, name)
    if SPECS[args.architecture].supports(specs.ACTORS) and args.num_envs % args.num_actors:
        raise UserError(f"num_envs: {args.num_envs} envs cannot be split evenly between {args.num_actors} actors")
    if args.torch_threads is not None:
        positive("torch_threads")
    if args.act_threads < 0:
        raise UserError(f"act_threads: must be >= 0 (0: as many as the update), got {args.act_threads}")
    if args.act_threads != Args.act_threads:
        require(args, specs.ACT_THREADS, "act_threads")
    if args.total_timesteps is not None:
        positive("total_timesteps")
    if args.max_episode_steps is not None:
        positive("max_episode_steps")
    if args.target_kl is not None and not (math.isfinite(args.target_kl) and args.target_kl > 0):
        raise UserError(f"target_kl: must be a positive finite number, got {args.target_kl}")
    if args.rollout_size() < args.num_minibatches:
        raise UserError(
            f"num_minibatches: {args.num_minibatches} exceeds the rollout size num_envs*num_steps={args.rollout_size()}"
        )
    if args.backend in ("HackAtari", "OCAtari") and not args.env_id.startswith("ALE/"):
        raise UserError(
            f"env_id: {args.backend} needs a full ALE id such as 'ALE/Freeway-v5' (bare names select v4 dynamics), "
            f"got {args.env_id!r}{backend_hint(args.backend, args.env_id)}"
        )
    validate_obs_mode(args.backend, args.obs_mode)
    if args.save_agent_wandb and not args.track:
        raise UserError("save_agent_wandb: uploads checkpoints to W&B, which needs --track")
    if args.run_name is not None and (not args.run_name or "/" in args.run_name or args.run_name in (".", "..")):
        raise UserError(f"run_name: must be a plain folder name, got {args.run_name!r}")
    if args.eval_every < 0:  # continual evaluation
        raise UserError(f"eval_every: must be >= 0, got {args.eval_every}")
    if args.eval_final_only and (args.eval_every or args.eval_at_switches):
        raise UserError("eval_final_only: evaluates at the end alone; drop --eval_every / --eval_at_switches, or it")
    positive("eval_episodes")
    for name in ("eval_num_envs", "eval_max_episode_steps"):
        if getattr(args, name) is not None:
            positive(name)
    validate_dqn_args(args)
    validate_network_args(args)
    if args.vector_env == "batched":
        blocked = batched_blocker(args.backend, args.capture_video, args.her, args.task_id_input)
        if blocked:
            raise UserError(f"vector_env: {blocked}")
    if args.bf16:
        require(args, specs.BF16, "bf16")
    if args.fused_adam:
        require(args, specs.FUSED_ADAM, "fused_adam")
    validate_compile_args(args)
    validate_her_args(args)
    validate_ewc_args(args)
    validate_plasticity_args(args)
    validate_clear_args(args)
    validate_pnc_args(args)
    # builds the env once: Box actions need PPO, no HER, no C-CHAIN
    validate_action_space(args.architecture, args.backend, args.env_id, args.her, args.c_chain)


def validate_compile_args(args: Args) -> None:
    """--compile / --cudagraphs (continual/training/accel.py): the agent compiles its steps; CUDA graphs need a GPU and
    shapes that stay the same from one update to the next."""
    if args.cudagraphs and not args.compile:
        raise UserError("cudagraphs: replays the steps that --compile compiles; add --compile")
    if not args.compile:
        return
    require(args, specs.COMPILE, "compile")  # not PPO_CBP: its unit tracking hooks modules a graph would skip
    if args.cudagraphs and args.her:  # relabelled samples change the minibatch size every update
        raise UserError("cudagraphs: needs static shapes; --her changes the minibatch size every update")
    if args.cudagraphs and args.rollout_size() % args.num_minibatches:
        raise UserError(f"cudagraphs: needs static shapes; num_envs*num_steps={args.rollout_size()} is not a multiple "
                        f"of num_minibatches={args.num_minibatches} (the last minibatch would be smaller)")
    on_cuda = args.cuda and torch.cuda.is_available()
    if args.cudagraphs and not on_cuda:
        raise UserError("cudagraphs: needs a CUDA device (none available, or --no-cuda)")
    if not on_cuda and not (shutil.which("c++") or shutil.which("g++")):
        raise UserError("compile: torch.compile on a CPU needs a C++ compiler (c++ or g++ on PATH); none found")


def validate_network_args(args: Args) -> None:
    """--network mlp: its own actor and critic torsos, which the methods that rewrite one shared torso do not know."""
    if args.hidden_size <= 0:
        raise UserError(f"hidden_size: must be positive, got {args.hidden_size}")
    if args.network == "default":
        return
    require(args, specs.MLP_NETWORK, "network")
    torso = [f for f, on in (("her", args.her), ("redo", args.redo), ("reset_layers", args.reset_layers),
                             ("layer_norm", args.layer_norm), ("activation", args.activation != "default"),
                             ("nap", args.nap), ("parseval", args.parseval)) if on]
    if torso:
        raise UserError(f"network: mlp has separate actor and critic torsos; --{torso[0]} works on one shared torso "
                        f"(use --network default)")


def validate_dqn_args(args: Args) -> None:
    """DQN flags: ranges, a ring per env that holds at least two whole observations, DQN-only switches."""
    for name in ("buffer_size", "train_frequency", "target_network_frequency", "replay_batch_size"):
        if getattr(args, name) <= 0:
            raise UserError(f"{name}: must be positive, got {getattr(args, name)}")
    if args.learning_starts < 0:
        raise UserError(f"learning_starts: must be >= 0, got {args.learning_starts}")
    for name in ("start_e", "end_e", "exploration_fraction", "tau"):
        v = getattr(args, name)
        if not (math.isfinite(v) and 0.0 <= v <= 1.0) or (name == "tau" and v == 0):
            raise UserError(f"{name}: must be in {'(0' if name == 'tau' else '[0'}, 1], got {v}")
    for name in ("double_dqn", "reset_replay_on_switch", "epsilon_rewarm_on_switch", "save_replay_buffer",
                 "learning_starts_each_regime"):
        if getattr(args, name):
            require(args, specs.DQN_FLAGS, name)
    if args.norm_obs:
        require(args, specs.NORM_OBS, "norm_obs")
    need = args.num_envs * (2 * args.buffer_window_size + 2)
    if SPECS[args.architecture].supports(specs.DQN_FLAGS) and args.buffer_size < need:
        raise UserError(f"buffer_size: {args.buffer_size} is too small for {args.num_envs} envs (at least {need})")


def validate_her_args(args: Args) -> None:
    """HER flags: ranges, and a goal space for the env (continual/envs/goals.py)."""
    for name in ("her_ratio", "her_env_reward_weight", "her_goal_reward"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name}: must be a non-negative finite number, got {v}")
    for name in ("her_tolerance", "her_is_clip"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"{name}: must be a positive finite number, got {v}")
    if args.her_k <= 0:
        raise UserError(f"her_k: must be positive, got {args.her_k}")
    if args.game_specific_goals and not args.her:
        raise UserError("game_specific_goals: only used with --her")
    if not args.her:
        return
    require(args, specs.HER, "her")
    try:
        make_goal_space(args.env_id, args.backend, args.game_specific_goals)
    except ValueError as e:
        raise UserError(str(e).replace("--", "", 1)) from None


def validate_plasticity_args(args: Args) -> None:
    """Plasticity methods (continual/plasticity/methods.py, networks.py): ranges, agents, combinations."""
    for name in ("redo_tau", "l2_coef", "l2_init_coef", "parseval_coef"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name}: must be a non-negative finite number, got {v}")
    if not (math.isfinite(args.parseval_scale) and args.parseval_scale > 0):
        raise UserError(f"parseval_scale: must be a positive finite number, got {args.parseval_scale}")
    for name in ("redo_every", "reset_layers", "reset_every"):
        if getattr(args, name) < 0:
            raise UserError(f"{name}: must be >= 0, got {getattr(args, name)}")
    used = [f for f in ("redo", "l2", "l2_init", "parseval") if getattr(args, f)] + (
        ["reset_layers"] if args.reset_layers else [])
    if used:  # PlasticityMethods reach these agents' loops (continual/methods.py) (not PNC: its two columns are not one torso)
        require(args, specs.PLASTICITY, used[0])
    network = [f for f, on in (("layer_norm", args.layer_norm), ("activation", args.activation != "default"),
                               ("nap", args.nap)) if on]
    if network:  # built through apply_network_options (not PPO_CBP: its trackers pair each layer with the next)
        require(args, specs.NETWORK_OPTIONS, network[0])
    if args.l2 and args.l2_init:
        raise UserError("l2_init: pulls the weights toward their initial values while --l2 pulls them toward zero; "
                        "choose one")
    if args.redo and args.activation != "default":
        raise UserError(f"redo: recycles units by their activation; --activation {args.activation} gives each unit "
                        f"two outputs (use the default activation)")
    if (args.redo or args.parseval or args.reset_layers or network) and args.her:
        raise UserError(f"{(used + network)[0]}: not supported with --her (the goal-fused layer is outside the torso)")
    if args.trac:
        if not (math.isfinite(args.trac_s_init) and args.trac_s_init > 0):
            raise UserError(f"trac_s_init: must be a positive finite number, got {args.trac_s_init}")
        require(args, specs.TRAC, "trac")
        # they write the weights directly; TRAC would overwrite them from its own iterate at its next step
        clash = [f for f, on in (("redo", args.redo), ("reset_layers", args.reset_layers),
                                 ("shrink_and_perturb", args.shrink_and_perturb), ("nap", args.nap)) if on]
        if clash:
            raise UserError(f"trac: not with --{clash[0]} (it changes the weights outside the optimizer, which TRAC "
                            f"recomputes from its own iterate)")
    validate_injection_args(args)
    if args.redo_every and not args.redo:
        raise UserError("redo_every: sets how often ReDo acts; add --redo")
    if args.reset_every and not args.reset_layers:
        raise UserError("reset_every: sets how often layers are reset; add --reset_layers K")
    if args.nap_project_heads and not args.nap:
        raise UserError("nap_project_heads: sets which layers NaP projects; add --nap")
    if args.trac_keep_base and not args.trac:
        raise UserError("trac_keep_base: sets how TRAC keeps its base iterate; add --trac")
    validate_c_chain_args(args)


def validate_c_chain_args(args: Args) -> None:
    """--c_chain (continual/plasticity/c_chain.py): ranges, agents, combinations."""
    for name in ("c_chain_target_rel_loss_scale", "c_chain_coef"):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name}: must be a non-negative finite number, got {v}")
        if v is not None and not args.c_chain:
            raise UserError(f"{name}: sets C-CHAIN's coefficient; add --c_chain")
    if not args.c_chain:
        return
    require(args, specs.C_CHAIN, "c_chain")
    if args.her:
        raise UserError("c_chain: not with --her (its reference batch would need the relabelled goals)")
    if args.plasticity_injection != "none":
        raise UserError("c_chain: not with --plasticity_injection (its reference network is a copy of the network "
                        "as built, which injection changes)")


INJECTION = ("PPO", "PPO_CBP", "IMPALA", "CLEAR", "DQN")  # agents whose heads continual/plasticity/injection.py
# rebuilds (PNC: its columns are not one torso with heads)


def validate_injection_args(args: Args) -> None:
    """--plasticity_injection (continual/plasticity/injection.py): its schedule, agents and combinations."""
    mode = args.plasticity_injection
    for name in ("injection_every", "injection_step"):
        if getattr(args, name) < 0:
            raise UserError(f"{name}: must be >= 0, got {getattr(args, name)}")
    if args.injection_every and mode != "every":
        raise UserError("injection_every: sets how often plasticity is injected; add --plasticity_injection every")
    if args.injection_step and mode != "step":
        raise UserError("injection_step: sets when plasticity is injected; add --plasticity_injection step")
    if mode == "none":
        return
    if mode == "every" and not args.injection_every:
        raise UserError("plasticity_injection: every needs --injection_every N (steps)")
    if args.architecture not in INJECTION:
        raise UserError(f"plasticity_injection: supported by {', '.join(INJECTION)}, not {args.architecture}")
    # methods that hold the heads' parameters as the network was built, or overwrite the heads
    clash = [f for f, on in (("reset_layers", args.reset_layers), ("trac", args.trac), ("nap", args.nap),
                             ("ewc", args.ewc != "none"),
                             ("perturb_mode fresh_init", args.shrink_and_perturb and args.perturb_mode == "fresh_init"))
             if on]
    if clash:
        why = {"reset_layers": "it re-initialises the heads that injection freezes",
               "trac": "TRAC's iterate holds the parameters as the network was built",
               "nap": "its projected layers are fixed when the network is built",
               "ewc": "its anchors and Fisher are per parameter of the network as built",
               "perturb_mode fresh_init": "it pairs the parameters with a fresh network's by name"}[clash[0]]
        raise UserError(f"plasticity_injection: not with --{clash[0]} ({why})")


def validate_actor_backend(args: Args) -> None:
    """--actor_backend and the flags only its Ray actors read."""
    if args.actor_backend != "process":
        require(args, specs.ACTORS, "actor_backend")
        return
    if args.ray_address is not None:
        raise UserError("ray_address: only used with --actor_backend ray")
    for name in ("max_in_flight", "actor_max_restarts"):
        if getattr(args, name) != getattr(Args, name):
            raise UserError(f"{name}: only used with --actor_backend ray")


def validate_ewc_args(args: Args) -> None:
    """EWC flags (continual/plasticity/ewc.py); the curriculum must switch (checked in training.startup.preflight)."""
    if not (math.isfinite(args.ewc_lambda) and args.ewc_lambda >= 0):
        raise UserError(f"ewc_lambda: must be a non-negative finite number, got {args.ewc_lambda}")
    in_gamma = math.isfinite(args.ewc_gamma) and 0.0 <= args.ewc_gamma <= 1.0
    if not in_gamma:
        raise UserError(f"ewc_gamma: must be in [0, 1], got {args.ewc_gamma}")
    for name in ("ewc_samples", "ewc_fisher_batch", "ewc_fisher_batches"):
        if getattr(args, name) <= 0:
            raise UserError(f"{name}: must be positive, got {getattr(args, name)}")
    if args.ewc != "none" and args.her:
        raise UserError("ewc: not supported with --her (the Fisher would need the goal of every buffered observation)")
    if args.ewc != "none":
        require(args, specs.EWC, "ewc")


def clear_replay_count(args: Args) -> int:
    """CLEAR: replayed unrolls per learner batch, new * f / (1 - f) for the batch's new single-env unrolls
    (batch_size x envs per actor); raises when that is not a whole number, so the mix is what was asked."""
    new = args.batch_size * (args.num_envs // args.num_actors)
    f = args.clear_replay_fraction
    exact = new * f / (1.0 - f)
    count = round(exact)
    if abs(exact - count) > 1e-6 * max(1.0, exact):
        raise UserError(f"clear_replay_fraction: {f} of a batch with {new} new unrolls needs {exact:.3g} replayed "
                        f"ones; choose f with {new}*f/(1-f) whole (e.g. 0.5: {new})")
    return count


def validate_clear_args(args: Args) -> None:
    """CLEAR flags (agents/clear.py); the buffer's disk space is checked in training.startup.preflight."""
    f = args.clear_replay_fraction
    if not (math.isfinite(f) and 0.0 <= f < 1.0):
        raise UserError(f"clear_replay_fraction: must be in [0, 1) (1 would train on replay only), got {f}")
    for name in ("clear_policy_cloning", "clear_value_cloning"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name}: must be a non-negative finite number, got {v}")
    if not SPECS[args.architecture].supports(specs.CLEAR_REPLAY):
        return
    if args.clear_buffer_frames < args.unroll_length:
        raise UserError(f"clear_buffer_frames: {args.clear_buffer_frames} holds no whole unroll of --unroll_length "
                        f"{args.unroll_length} steps")
    clear_replay_count(args)


def validate_pnc_args(args: Args) -> None:
    """Progress & Compress flags (agents/pnc.py); the curriculum must switch (checked in training.startup.preflight)."""
    if not (math.isfinite(args.pnc_progress_fraction) and 0.0 < args.pnc_progress_fraction < 1.0):
        raise UserError(f"pnc_progress_fraction: must be in (0, 1) (both phases in every task), "
                        f"got {args.pnc_progress_fraction}")
    for name in ("pnc_kl_scale", "pnc_ewc_lambda"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name}: must be a non-negative finite number, got {v}")
    if args.shrink_and_perturb and not SPECS[args.architecture].supports(specs.SHRINK_PERTURB):
        # PNC: it would perturb the knowledge base; P&C re-initialises its active column at every switch already
        raise UserError(f"shrink_and_perturb: not with --architecture {args.architecture} (supported by "
                        f"{names_of(supporting(specs.SHRINK_PERTURB))})")
