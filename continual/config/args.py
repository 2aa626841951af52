"""The training `Args`: every flag of `continual_training_example.py` and of the agent scripts.

One flat dataclass so that flags keep the seed project's names (`--env_id`, `--replacement_rate`, ...); --help writes
them so, and tyro accepts both `--env_id` and `--env-id`. A `run_config.json` may set any field by name (see `continual.config.loading`), and the
curriculum keys `modification_factory` / `modification_factory_kwargs`, which are not flags.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal, Optional

from continual.io import between_markers, update_between_markers
from continual.specs import ARCHITECTURES, DEFAULT_GRAD_CLIP, SPECS

BACKENDS = ("HackAtari", "OCAtari", "Gymnasium")


@dataclasses.dataclass
class Args:
    # --- run -------------------------------------------------------------------------------------------------------
    config: Optional[str] = None
    """path to a run_config.json (curriculum + any of these fields); flags given on the command line override it"""
    exp_name: str = ""
    """experiment name used in the run name (default: the architecture in lower case)"""
    run_name: Optional[str] = None
    """name of the run directory under --runs_dir (default: <game>__<exp_name>__s<seed>__<unix time>)"""
    runs_dir: str = "runs"
    """parent folder of run directories"""
    architecture: Literal[ARCHITECTURES] = "PPO"
    """the agent to train, with its own algorithm's defaults where no config or flag sets them (docs/extending.md)"""
    seed: int = 1
    """seed of the run: torch, numpy, envs (env i gets seed+i) and the curriculum"""
    torch_deterministic: bool = True
    """sets `torch.backends.cudnn.deterministic`"""
    cuda: bool = True
    """use CUDA when available"""
    torch_threads: Optional[int] = None
    """CPU threads for torch (default: 1 for vector/object observations and small grids such as MinAtar's: on 2 idle
    cores a second thread speeds PureJaxRL's MinAtar settings 1.26x, but under OpenMP's PASSIVE wait, which the
    launcher sets, it slows them 1.2x, and without it it spins against whatever shares the cores
    (docs/benchmarks/small-envs.md); torch's default for pixels)"""
    act_threads: int = 1
    """CPU threads for torch while a rollout acts (PPO's act step: a forward pass over num_envs observations between
    env steps; the update keeps --torch_threads): more threads synchronise and spin against the env workers for too
    little work. The same actions, log-probs and values bit for bit on this project's CPUs (tested). 0: as many as
    the update"""
    total_timesteps: Optional[int] = None
    """agent steps (summed over envs) to train; default: the length of the curriculum (10M without one)"""
    resume: Optional[str] = None
    """continue a run from a checkpoint file or a run directory (its newest checkpoint)"""
    verbose: bool = False
    """print every setting at the start of the run (default: a short summary with the settings that differ from the
    defaults; config.json in the run directory holds every setting either way)"""

    # --- environment -----------------------------------------------------------------------------------------------
    env_id: str = "ALE/Freeway-v5"
    """gymnasium id; use full `ALE/<Game>-v5` ids for Atari (bare names silently mean v4 dynamics)"""
    backend: Literal["HackAtari", "OCAtari", "Gymnasium", "MinAtar", "MiniHack"] = "HackAtari"
    """HackAtari (modified Atari), OCAtari (object-centric, unmodified), Gymnasium (any id, `name=value` modifications), MinAtar (`MinAtar/<Game>` 10x10 grids, `name=value` modifications), MiniHack (`MiniHack-*` NetHack tasks with CORA's rewards; tasks are env ids)"""
    obs_mode: Literal["dqn", "obj", "ori", "pixel_crop", "glyphs_crop"] = "dqn"
    """Atari observations: dqn (4x84x84 grey uint8 stack), obj (object coordinates), ori (raw RGB frame); MiniHack:
    pixel_crop (CORA's 3x84x84 RGB crop around the agent, what dqn means there) or glyphs_crop (a one-hot of the 9x9
    glyphs around the agent, for fast agents)"""
    task_id_input: bool = False
    """give the agent the task identity: a one-hot of the current regime (its index among the curriculum's regimes)
    appended to every observation, as constant extra channels for frames and grids, extra entries for vectors"""
    modifs: str = ""
    """modification string used when no curriculum is configured (e.g. "all_green_cars reverse_car_speed_top")"""
    num_envs: int = 8
    """number of parallel environments"""
    vector_env: Literal["auto", "async", "sync", "batched"] = "auto"
    """vector env: async = the envs spread over worker processes (--envs_per_worker); sync = one after another in the
    learner; batched = MinAtar's games stepped in one loop below the wrappers (several times faster); auto = async for
    Atari, batched for MinAtar (sync with videos, HER or task ids), sync otherwise"""
    envs_per_worker: int = 0
    """async vector env: envs stepped by each worker process (one message each way per worker and step); 0 = the
    envs spread evenly over min(num_envs, cores) workers"""
    frameskip: int = 4
    """Atari frames per agent step"""
    buffer_window_size: int = 4
    """frames stacked in an Atari observation"""
    repeat_action_probability: float = 0.25
    """Atari (ALE) sticky actions (v5 default 0.25); MinAtar does not read it: its token `sticky_action_prob=<p>` sets
    MinAtar's own (0.1 by default)"""
    noop_max: int = 30
    """up to this many random no-ops after each Atari reset"""
    deactivate_episodic_life: bool = False
    """do not end training episodes at a life loss (episode statistics are always whole games)"""
    reward_scaling: Optional[Literal["clip", "normalize", "none", "zero"]] = None
    """training rewards: clip = sign (CleanRL Atari), normalize = divided by a running std of the discounted return,
    zero = every reward 0 (a control: what the learner does with no reward; episode statistics stay the game's);
    default: clip, none for MiniHack (its -0.001 step penalty clipped would cost as much as a win)"""
    norm_obs: bool = False
    """standardise observations by running statistics saved with the weights (CleanRL's continuous-action PPO)"""
    max_episode_steps: Optional[int] = None
    """truncate episodes after this many agent steps (Atari: also caps emulator frames at frameskip x this)"""

    # --- PPO -------------------------------------------------------------------------------------------------------
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    adam_beta1: float = 0.9
    """Adam's beta1 (PPO, PPO_CBP); Dohare et al.'s "non-stationary Adam" (their loss-of-plasticity runs, CBP's
    settings included) sets beta1 = beta2 = 0.99"""
    adam_beta2: float = 0.999
    """Adam's beta2 (PPO, PPO_CBP)"""
    fused_adam: bool = False
    """PPO and DQN: Adam's fused kernel (torch.optim.Adam(fused=True)), one pass over each parameter per step
    instead of six: the same update up to float rounding (a different order of the same operations), faster where
    the update is small (MinAtar's network at one update per env step: bench/dqn_minatar_speed.py; PPO's 64-unit
    MLPs, configs/minatar_ppo.json: docs/benchmarks/small-envs.md)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the whole run (not reset at switches)"""
    num_steps: int = 128
    """steps per env per rollout (a rollout is num_envs x num_steps agent steps; curricula are asked once per rollout;
    DQN: per iteration, which is when statistics are logged)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """epochs per rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.1
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss as in CleanRL/baselines"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: Optional[float] = None
    """gradient clipping norm (default: 0.5 for PPO, PPO_CBP and A2C, whose losses are means; 40 for IMPALA, CLEAR and
    PNC, whose losses are sums over the batch, as TorchBeast: with 0.5 their updates shrink ~100x and IMPALA does not
    learn)"""
    target_kl: Optional[float] = None
    """stop the epochs of an update early once the approximate KL exceeds this"""
    bf16: bool = False
    """PPO/PPO_CBP: run the update's forward pass under bfloat16 autocast (weights, gradients and the optimizer stay
    float32; losses in float32). Pays off for the Nature CNN on CPUs with AVX-512 BF16/AMX and on recent GPUs
    (da56a98:bench/update_limit.py); acting stays float32"""
    compile: bool = False
    """PPO: compile the act step (policy forward + sampling) and the update's forward pass + loss with torch.compile
    (the backward comes compiled with it; optimizer and clipping stay eager): the same games and weights as eager to
    float rounding. For GPUs (LeanRL's approach, with --cudagraphs); on a 2-core CPU no faster than eager
    (docs/benchmarks/gpu.md). Costs tens of seconds of compiling when a run starts or resumes, and a C++ compiler on CPU"""
    cudagraphs: bool = False
    """PPO with --compile, on CUDA: replay the compiled steps as CUDA graphs (torch.compile mode "reduce-overhead"),
    which removes the per-kernel launch cost that dominates small networks on a GPU; needs static shapes (no --her,
    num_envs*num_steps a multiple of num_minibatches)"""

    # --- network ---------------------------------------------------------------------------------------------------
    network: Literal["default", "mlp"] = "default"
    """default: the observation's network (Nature CNN for frames, MinAtar's CNN for grids, a tanh MLP for vectors),
    one torso shared by actor and critic; mlp: PureJaxRL's separate actor and critic MLPs (2 hidden layers of
    --hidden_size units) on the flattened observation (PPO, A2C, IMPALA, CLEAR)"""
    hidden_size: int = 64
    """--network mlp: units per hidden layer"""
    mlp_activation: Literal["relu", "tanh"] = "relu"
    """--network mlp: hidden activation (PureJaxRL's MinAtar config: relu)"""

    # --- tracking and outputs -----------------------------------------------------------------------------------
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "continual_hackatari"
    """W&B project"""
    wandb_entity: Optional[str] = None
    """W&B entity (team or user)"""
    wandb_dir: Optional[str] = None
    """W&B local folder (default: the run directory)"""
    wandb_group: Optional[str] = None
    """W&B group of the run (python -m continual.launch sets the experiment's name, so seeds and methods of one
    experiment are compared together)"""
    wandb_tags: str = ""
    """W&B tags, comma-separated"""
    capture_video: bool = False
    """record episodes of env 0 on gymnasium's capped cubic schedule, as CleanRL does (episodes 0, 1, 8, 27, ...,
    729, then every 1000th), plus the first episode of each regime; file names carry regime and step"""
    video_every: int = 0
    """with --capture_video: record every n-th episode of env 0 instead (0: the capped cubic schedule)"""
    save_agent_with_switch: bool = False
    """checkpoint at every regime switch, named after the outgoing regime and the step"""
    save_agent_wandb: bool = False
    """with --track: upload checkpoints as W&B artifacts"""
    checkpoint_minutes: float = 5.0
    """checkpoint when this many minutes have passed since the last checkpoint (checked after every iteration, so a
    crash loses at most this plus one iteration; 0: off)"""
    checkpoint_every: int = 0
    """also checkpoint every this many agent steps (0: off; switch checkpoints need --save_agent_with_switch, the
    final one is always written)"""
    keep_checkpoints: int = 3
    """periodic checkpoints (--checkpoint_minutes, --checkpoint_every) to keep; switch, crash, interrupted and final
    checkpoints are always kept"""
    progress_bar: bool = True
    """show a progress bar (steps, SPS, regime, recent return)"""

    # --- continual backpropagation (PPO_CBP) ------------------------------------------------------------------------
    replacement_rate: float = 1e-5
    """CBP: fraction of mature units of each hidden layer re-initialised per optimizer update (paper RL value: 1e-4)"""
    maturity_threshold: int = 100
    """CBP: a unit may be replaced once it has lived this many optimizer updates (paper RL value: 10000)"""
    decay_rate: float = 0.99
    """CBP: running-average decay of the contribution utility"""
    init: Literal["kaiming", "lecun", "xavier", "default"] = "kaiming"
    """CBP: initialisation of the incoming weights of replaced units"""
    utility: Literal["contribution", "mean_contribution"] = "contribution"
    """CBP: contribution utility |h|*sum|w_out|, or its mean-corrected variant |h - mean(h)|*sum|w_out|"""

    # --- plasticity remedies and diagnostics -------------------------------------------------------------------------
    shrink_and_perturb: bool = False
    """at every regime switch (never before the first regime): theta <- shrink_factor*theta + perturbation"""
    shrink_factor: float = 0.7
    """shrink & perturb: lambda"""
    noise_scale: float = 0.01
    """shrink & perturb: sigma of the Gaussian noise (perturb_mode noise) or weight p of a fresh initialisation
    (perturb_mode fresh_init, Ash & Adams)"""
    perturb_mode: Literal["noise", "fresh_init"] = "noise"
    """shrink & perturb: noise = lambda*theta + sigma*N(0, I); fresh_init = lambda*theta + p*theta_fresh"""
    reset_optimizer_on_switch: bool = False
    """reset the optimizer state (Adam moments) at every regime switch"""
    diagnostics_every: int = 0
    """plasticity diagnostics (dormant units, effective rank, norms) every this many steps (0: at switches only)"""
    dormant_tau: float = 0.025
    """a unit is dormant when its mean |activation| is at most tau times the layer's mean (Sokar et al. 2023)"""

    # --- plasticity methods ------------------------------------------------------------------------------------------
    redo: bool = False
    """ReDo (Sokar et al. 2023): re-initialise the incoming weights of tau-dormant hidden units, zero their outgoing
    weights and their optimizer state; at every regime switch (on the first update of the new regime) or every
    --redo_every steps"""
    redo_tau: float = 0.025
    """ReDo: a unit is dormant when its mean |activation| is at most tau times its layer's mean (Plasticine: 0.025)"""
    redo_every: int = 0
    """ReDo: recycle every this many steps (0: at every regime switch; Sokar et al. recycle every 1000 updates)"""
    l2: bool = False
    """L2 regularisation toward zero: + l2_coef * sum theta^2 added to the loss (Kumar et al. 2023's baseline)"""
    l2_coef: float = 5e-4
    """L2: the coefficient (5e-4: the gradient 1e-3 theta of Plasticine's Adam weight decay 1e-3)"""
    l2_init: bool = False
    """regenerative regularisation (L2 Init, Kumar et al. 2023): + l2_init_coef * sum (theta - theta_0)^2 toward the
    initial weights"""
    l2_init_coef: float = 1e-4
    """L2 Init: the coefficient of the squared distance (Kumar et al. tune it per problem in {1e-2, ..., 1e-5}).
    1e-4 (set in 21e9535): the best of the three values run for PPO on permuted MinAtar Breakout
    (configs/experiments/plasticity_minatar.json: 1e-2, 1e-3, 1e-4), chosen on the seeds that result is reported on
    (no separate tuning seeds), so that result overstates it; 1e-2 held the weights at their initial values.
    Plasticine's 1e-2 multiplies the unsquared norm, a far weaker pull"""
    parseval: bool = False
    """Parseval regularisation (Chung et al. 2024): + parseval_coef * sum ||W W^T - s I||_F^2 over the torso's layers
    (not the heads)"""
    parseval_coef: float = 1e-3
    """Parseval: the coefficient (Chung et al. and Plasticine: 1e-3)"""
    parseval_scale: float = 1.0
    """Parseval: the target s of W W^T = s I"""
    layer_norm: bool = False
    """LayerNorm between every hidden layer and its activation (Lyle et al. 2024); GroupNorm(1, C) for convolutions"""
    activation: Literal["default", "crelu", "fourier"] = "default"
    """hidden activation: the architecture's own, CReLU [relu(x), relu(-x)] (Abbas et al. 2023) or deep Fourier
    features [sin(x), cos(x)] (Lewandowski et al. 2024); both double the inputs of the next layer"""
    reset_layers: int = 0
    """layer resetting (Nikishin et al. 2022): re-initialise the last this-many layers (1: the heads) and their
    optimizer state at every regime switch or every --reset_every steps (0: off)"""
    reset_every: int = 0
    """layer resetting: every this many steps (0: at every regime switch)"""
    nap: bool = False
    """Normalize-and-Project (Lyle et al. 2024): LayerNorm before every hidden activation (implies --layer_norm) and,
    after every optimizer step, every weight matrix of the torso projected back to its initial norm"""
    nap_project_heads: bool = False
    """NaP: also project the output heads (actor, critic, Q) back to their initial norms, as Plasticine does. Off,
    they stay free: no normalisation follows them, so their norm sets the outputs' scale, and PPO's actor head,
    held at its initial norm (0.01 per action), keeps the policy near uniform"""
    trac: bool = False
    """TRAC (Muppidi et al. 2024): the agent's optimizer runs on its own iterate and the weights are its displacement
    from the initial weights times a learned scale (betas 0.9 ... 0.999999, as the paper)"""
    trac_s_init: float = 1e-8
    """TRAC: s_init, the scale's starting magnitude (the paper's 1e-8)"""
    trac_keep_base: bool = False
    """TRAC: keep the base optimizer's iterate explicitly, as the paper's Algorithm 1 writes it. Off, as the reference
    code (and Plasticine): the iterate is recovered from the weights every step by dividing by the scale S (+ 1e-8),
    which restarts it from the initial weights whenever S falls to 0 or below"""
    plasticity_injection: Literal["none", "at_switches", "every", "step"] = "none"
    """plasticity injection (Nikishin et al. 2023): freeze the heads and add a fresh trainable head minus its frozen
    copy, so the output is unchanged and the head learns anew (the torso keeps learning); at every regime switch,
    every --injection_every steps, or once at --injection_step"""
    injection_every: int = 0
    """plasticity injection every: inject every this many steps (each injection freezes the injected head again)"""
    injection_step: int = 0
    """plasticity injection step: inject once at this step (0: half of the run, as Plasticine; the paper injects once
    into a long Atari run, its diagnostic use)"""
    c_chain: bool = False
    """C-CHAIN (Tang et al. 2025): + coef * churn, the change of the outputs on a reference batch since the previous
    update, with coef set automatically to keep it a fixed fraction of the main loss (continual/plasticity/c_chain.py;
    DQN: squared change of the Q-values, PPO with discrete actions: cross-entropy of the policy)"""
    c_chain_target_rel_loss_scale: Optional[float] = None
    """C-CHAIN: the churn term's target size relative to the main loss (default: the paper code's, 0.01 for DQN, its
    MinAtar value, and 10000 for PPO, its ProcGen value, whose churn term is a cross-entropy); 0: the coefficient stays
    at --c_chain_coef"""
    c_chain_coef: Optional[float] = None
    """C-CHAIN: the starting coefficient, before the automatic one takes over (default: the paper code's, 50 for DQN,
    10 for PPO)"""

    # --- elastic weight consolidation (EWC) --------------------------------------------------------------------------
    ewc: Literal["none", "ewc", "online"] = "none"
    """EWC at regime switches (continual/plasticity/ewc.py): ewc = one anchor (theta*, Fisher) per ended regime
    (Kirkpatrick et al. 2017), online = one running Fisher and the latest anchor (Schwarz et al. 2018); needs a
    curriculum that switches"""
    ewc_lambda: float = 500.0
    """EWC: penalty weight lambda in lambda/2 * sum F (theta - theta*)^2 (CORA: 500 ewc, 25 online; its Atari configs:
    10000 ewc, 175 online). With --ewc_fisher cora and IMPALA (losses summed over the batch, as CORA's) CORA's
    lambdas mean what they mean there; PPO's losses are minibatch means, so a CORA lambda is about lambda /
    minibatch size for PPO. --ewc_fisher true is per sample and far smaller (see --ewc_fisher)"""
    ewc_fisher: Literal["cora", "true"] = "cora"
    """EWC: the Fisher estimator. cora = CORA's: the squared gradient of the agent's policy-gradient + value loss
    summed over a batch of --ewc_fisher_batch stored samples, averaged over --ewc_fisher_batches batches (IMPALA:
    V-trace losses on stored unrolls; PPO: -sum A log pi + vf_coef/2 sum (R - V)^2 with the rollout's GAE
    advantages and returns). true = the per-sample true Fisher of the policy (actions drawn from it, value head 0);
    on trained MinAtar IMPALA networks it is 400-1,100x smaller than cora's on the policy head and 5,000-24,000x on
    the torso, so its lambda must be that much larger for the same strength (docs/results/forgetting.md, "EWC's two
    Fisher scales")"""
    ewc_fisher_batch: int = 400
    """EWC, --ewc_fisher cora: samples per Fisher batch (CORA: batch_size x unroll_length, 20 x 20 = 400 in its
    defaults, 32 x 20 = 640 in its Atari configs); IMPALA takes the nearest whole number of unrolls"""
    ewc_fisher_batches: int = 100
    """EWC, --ewc_fisher cora: batches the squared gradients are averaged over (CORA's n_fisher_samples: 100)"""
    ewc_gamma: float = 0.99
    """EWC: online decay, F <- gamma*F + F_new (ewc online only; CORA: 0.99)"""
    ewc_samples: int = 1024
    """EWC: the Fisher is estimated on the last this-many agent steps the learner trained on in the ending regime
    (cora: its batches are drawn from them; true: one action sampled from the policy per observation); also the
    size of the buffer kept in checkpoints"""
    ewc_normalize: Literal["none", "full"] = "none"
    """EWC: full = divide each Fisher tensor by its L2 norm, after the online sum (CORA's normalize_fisher_method
    "full"; CORA's online EWC and P&C use it)"""
    ewc_scale_by_tasks: bool = True
    """EWC: divide the ewc penalty by the number of anchors in force (CORA's scale_ewc_by_num_tasks, its default)"""
    ewc_omit_current: bool = False
    """EWC: leave out the current regime's own anchor from an earlier visit (CORA's omit_ewc_for_current_task)"""

    # --- IMPALA ------------------------------------------------------------------------------------------------------
    num_actors: int = 2
    """IMPALA: actors (processes, or Ray actors with --actor_backend ray); --num_envs envs are split evenly between
    them"""
    actor_backend: Literal["process", "ray"] = "process"
    """IMPALA: where the actors run: `process` (processes on this machine, unrolls through shared memory) or `ray`
    (Ray actors of one CPU each, on this machine or on a cluster with --ray_address; docs/agents.md)"""
    ray_address: Optional[str] = None
    """IMPALA, --actor_backend ray: the Ray cluster the actors run on (`HEAD_IP:6379`, or `auto` for the one `ray
    start` runs on this machine); default: a Ray instance of the run's own on this machine, with --num_actors CPUs"""
    broadcast_interval: int = 1
    """IMPALA: learner updates between two publications of its weights to the actors (they are also published at
    every switch); the policy lag grows with it"""
    max_in_flight: int = 2
    """IMPALA, --actor_backend ray: unroll requests each actor has queued; each request carries the weights that are
    current when it is sent, so the policy lag grows with it"""
    actor_max_restarts: int = 3
    """IMPALA, --actor_backend ray: restarts of each actor (killed, or its node lost) before its death ends the run;
    the unroll it was playing is dropped"""
    unroll_length: int = 20
    """IMPALA: steps per unroll (T)"""
    batch_size: int = 4
    """IMPALA: unrolls per learner update"""
    vtrace_rho_bar: float = 1.0
    """IMPALA: V-trace truncation of the importance weights in the value targets and policy gradient"""
    vtrace_c_bar: float = 1.0
    """IMPALA: V-trace truncation of the trace coefficients c"""
    rmsprop_alpha: float = 0.99
    """IMPALA, A2C: RMSprop smoothing constant"""
    rmsprop_eps: float = 0.01
    """IMPALA, A2C: RMSprop epsilon (A2C's usual value, baselines/SB3: 1e-5)"""

    # --- CLEAR -------------------------------------------------------------------------------------------------------
    clear_buffer_frames: int = 100_000
    """CLEAR: replay buffer capacity in agent steps, stored as whole unrolls of --unroll_length steps of one env (a
    file under <run>/replay, preallocated; every checkpoint holds a copy: 2.97 GB for Atari frames at the default;
    CORA: 1e8, far beyond one disk with Atari frame stacks)"""
    clear_replay_fraction: float = 0.5
    """CLEAR: share of replayed unrolls in every learner batch, in [0, 1) (CORA: batch_replay_ratio 1.0, half new,
    half replayed); the batch's new unrolls times f/(1-f) must be a whole number"""
    clear_policy_cloning: float = 0.01
    """CLEAR: weight of the policy-cloning loss, KL(stored behaviour policy || current) summed over the replayed
    steps (CORA: 0.01)"""
    clear_value_cloning: float = 0.005
    """CLEAR: weight of the value-cloning loss, sum of (V(x_t) - stored behaviour value)^2 over the replayed steps
    (CORA: 0.005)"""

    # --- Progress & Compress (PNC) -----------------------------------------------------------------------------------
    pnc_progress_fraction: float = 0.5
    """PNC: share of each task (a regime visit, from the curriculum's schedule) spent in the progress phase (the
    active column learns with IMPALA's loss, the knowledge base is frozen); the rest is the compress phase (the
    knowledge base distils the active column under online EWC). CORA counts a fixed number of learner steps
    (num_train_steps_of_progress, 1000) and its shipped configs set it to half a task"""
    pnc_kl_scale: float = 1.0
    """PNC: weight of KL(pi_active || pi_KB), summed over the T x B batch as IMPALA's losses, in the compress phase
    (CORA's kl_div_scale)"""
    pnc_ewc_lambda: float = 25.0
    """PNC: online-EWC weight on the knowledge base in the compress phase (CORA's P&C inherits online EWC's 25); the
    Fisher decays by --ewc_gamma and is estimated on the last --ewc_samples observations of each task"""
    pnc_ewc_normalize: Literal["none", "full"] = "full"
    """PNC: full = divide each tensor of the knowledge base's running Fisher by its L2 norm after the online sum
    (CORA's P&C: full, so the Fisher's scale does not matter there); the KB's Fisher is the per-sample true Fisher"""

    # --- DQN ---------------------------------------------------------------------------------------------------------
    buffer_size: int = 1_000_000
    """DQN: replay capacity in transitions (one uint8 frame each for Atari pixels; split evenly between envs)"""
    learning_starts: int = 80_000
    """DQN: agent steps stored before the first update (again after --reset_replay_on_switch, or a resume without
    the buffer)"""
    train_frequency: int = 4
    """DQN: one gradient step per this many agent steps (summed over envs)"""
    target_network_frequency: int = 1000
    """DQN: update the target network every this many agent steps"""
    tau: float = 1.0
    """DQN: target network update rate (1: copy)"""
    replay_batch_size: int = 32
    """DQN: transitions per gradient step"""
    start_e: float = 1.0
    """DQN: starting epsilon of the epsilon-greedy exploration"""
    end_e: float = 0.01
    """DQN: final epsilon"""
    exploration_fraction: float = 0.10
    """DQN: fraction of the run's steps over which epsilon decays linearly from start_e to end_e"""
    double_dqn: bool = False
    """DQN: Double DQN targets, Q_target(s', argmax_a Q(s', a)) (van Hasselt et al. 2016)"""
    learning_starts_each_regime: bool = False
    """DQN: --learning_starts at the start of every regime: its first learning_starts agent steps act uniformly at
    random and train nothing (the buffer keeps earlier regimes' transitions), and epsilon decays from the end of the
    first such phase (C-CHAIN's Continual MinAtar: 10k random steps per task)"""
    reset_replay_on_switch: bool = False
    """DQN: empty the replay buffer at every regime switch (training waits for --learning_starts new transitions)"""
    epsilon_rewarm_on_switch: bool = False
    """DQN: restart the epsilon decay from start_e at every regime switch"""
    save_replay_buffer: bool = False
    """DQN: store the replay buffer in every checkpoint, for an exact resume (large: up to buffer_size x the bytes
    per transition printed at the start, 7.1 GB for 1M Atari transitions; consider a larger --checkpoint_minutes)"""

    # --- HER ---------------------------------------------------------------------------------------------------------
    her: bool = False
    """hindsight experience replay (PPO, PPO_CBP): goal-conditioned policy, goal rewards, relabelled samples in the
    update with importance weights (see continual/envs/goals.py); HackAtari/OCAtari games or continual/GoalGrid-v0"""
    game_specific_goals: bool = False
    """HER: per-game goal spaces (Freeway chicken height; Kangaroo x + floor; Frostbite x + ice row) instead of the
    generic player position"""
    her_strategy: Literal["final", "future"] = "future"
    """HER: relabel with the goal achieved at the end of each episode piece (final) or at a later step (future)"""
    her_k: int = 4
    """HER: relabelled copies per episode piece with --her_strategy future"""
    her_ratio: float = 1.0
    """HER: relabelled samples per original sample in the update (at most; 0: goal-conditioned PPO, no relabelling)"""
    her_tolerance: float = 0.05
    """HER: success when the achieved goal is within this distance of the desired one (normalised units, max norm)"""
    her_env_reward_weight: float = 1.0
    """HER: weight of the env reward in the training reward (0: goal reward only)"""
    her_goal_reward: float = 1.0
    """HER: reward of a step whose achieved goal matches the desired goal"""
    her_is_clip: float = 1.0
    """HER: clip of the importance weight pi_old(a|s,g')/mu(a|s,g) of relabelled samples"""

    # --- continual evaluation ----------------------------------------------------------------------------------------
    eval_every: int = 0
    """evaluate the policy on every regime the curriculum can emit (+ --eval_modifs) every this many agent steps, and
    at step 0 and at the end of the run (0: off); results in <run>/eval_table.csv and eval/<regime> scalars"""
    eval_at_switches: bool = False
    """also evaluate right before every regime switch (the end of each visit; turns evaluation on by itself)"""
    eval_final_only: bool = False
    """evaluate once, at the end of the run (every regime + --eval_modifs, --eval_episodes whole games each): the
    seed's eval.py protocol after training, without step 0 or a schedule (not with --eval_every/--eval_at_switches)"""
    eval_episodes: int = 5
    """games per regime at each evaluation (whole games, no life cuts, unless --eval_max_episode_steps)"""
    eval_modifs: str = ""
    """held-out modification strings to evaluate too, separated by ';' (an empty item, as in 'disable_cars;', is the
    unmodified game); checked against the game before any env is built"""
    eval_greedy: bool = False
    """evaluate with the most likely action instead of sampling (sampling uses a private generator, never the
    training RNG)"""
    eval_num_envs: Optional[int] = None
    """evaluation envs (default: min(eval_episodes, 4)); env i is seeded eval_seed+i"""
    eval_seed: Optional[int] = None
    """seed of the evaluation envs and action sampling (default: seed + 10000)"""
    eval_reseed: bool = False
    """re-seed the evaluation envs before every regime of every evaluation: the same games each time up to the
    policy (an Atari seed reloads the ROM, ~0.2 s per regime); default: seeded once, at the first evaluation"""
    eval_max_episode_steps: Optional[int] = None
    """cap evaluation games at this many agent steps (default: --max_episode_steps); a capped game counts as one"""
    eval_background: bool = False
    """evaluate in a background process on a CPU copy of the weights, so training does not wait for it"""
    metrics: bool = True
    """with evaluation on: write metrics.json (final/average performance, forgetting, transfer, plasticity) at the
    end of the run (python -m continual.evaluation.metrics recomputes it)"""
    plots: bool = False
    """write PNG plots (training returns, evaluation curves and heatmap, plasticity) to <run>/plots at the end of
    the run, and to W&B with --track (python -m continual.evaluation.plots redraws them)"""

    # --- filled at run time ------------------------------------------------------------------------------------------
    def rollout_size(self) -> int:
        """PPO: agent steps per rollout (num_envs x num_steps); the curriculum is asked at each rollout start."""
        return self.num_envs * self.num_steps

    def minibatch_size(self) -> int:
        return self.rollout_size() // self.num_minibatches

    def grad_clip_norm(self) -> float:
        """--max_grad_norm, or the architecture's default when it is not set."""
        if self.max_grad_norm is not None:
            return self.max_grad_norm
        return SPECS[self.architecture].defaults.get("max_grad_norm", DEFAULT_GRAD_CLIP)


def default_args(architecture: str = "PPO") -> Args:
    """Args with the architecture's own defaults (continual/specs.py) where they differ from PPO's."""
    return Args(architecture=architecture, **SPECS[architecture].defaults) if architecture in SPECS else Args()


def field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(Args)}


def sections() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The `# --- title ---` sections of Args in order, each with its fields as (name, default source, docstring)."""
    import ast
    import inspect

    src = inspect.getsource(__import__(__name__, fromlist=["Args"]))
    lines = src.splitlines()
    encoded = [line.encode() for line in lines]  # ast's column offsets count UTF-8 bytes

    def segment(node: ast.AST) -> str:  # ast.get_source_segment re-splits the whole file per call: 0.6 s a startup
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return encoded[first][node.col_offset:node.end_col_offset].decode()
        parts = [encoded[first][node.col_offset:], *encoded[first + 1:last], encoded[last][:node.end_col_offset]]
        return b"\n".join(parts).decode()

    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "Args")
    out: list[tuple[str, list[tuple[str, str, str]]]] = []
    for i, node in enumerate(cls.body):
        if not isinstance(node, ast.AnnAssign):
            continue
        comment = lines[node.lineno - 2].strip()
        if comment.startswith("# ---") or not out:
            out.append((comment.strip("#- ").strip(), []))
        nxt = cls.body[i + 1] if i + 1 < len(cls.body) else None
        doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
        default = segment(node.value) if node.value is not None else ""
        out[-1][1].append((node.target.id, default, " ".join(doc.split())))
    return out


def markdown_text(doc: str) -> str:
    """A docstring as table-cell text: | would end the cell, <run> would be read as an HTML tag, a*b*c and a__b__c
    as emphasis."""
    return doc.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*").replace("__", "\\_\\_")


def flag_table_markdown() -> str:
    """The flag reference's tables (docs/flags.md), generated from this file (sections, defaults, docstrings)."""
    out: list[str] = []
    for title, fields in sections():
        out.append(f"\n## {title}\n\n| flag | default | meaning |\n|---|---|---|")
        out += [f"| `--{name}` | `{default}` | {markdown_text(doc)} |" for name, default, doc in fields]
    return "\n".join(out).strip() + "\n"


# --help in groups (run, environment, PPO, ...): tyro makes one panel per nested dataclass, and OmitArgPrefixes keeps
# the flat flag names. The nested class is built from the sections above, so Args stays the one flat dataclass.
GROUP_KEYS = {"run": "run", "environment": "environment", "PPO": "PPO", "tracking and outputs": "tracking",
              "continual backpropagation (PPO_CBP)": "CBP", "plasticity remedies and diagnostics": "plasticity",
              "plasticity methods": "methods",
              "elastic weight consolidation (EWC)": "EWC", "IMPALA": "IMPALA", "CLEAR": "CLEAR",
              "Progress & Compress (PNC)": "PNC", "DQN": "DQN", "HER": "HER",
              "continual evaluation": "evaluation"}


def grouped_class() -> type:
    """A dataclass with one nested dataclass per section of Args (for tyro's --help panels)."""
    import re
    import typing

    import tyro

    hints = typing.get_type_hints(Args)
    defaults = {f.name: f.default for f in dataclasses.fields(Args)}
    groups = []
    for title, fields in sections():
        key = GROUP_KEYS.get(title, re.sub(r"\W+", "_", title).strip("_"))
        members = []
        for name, _, doc in fields:
            # a docstring that explains the default itself: tyro's "(default: None)" would repeat it
            hint = "" if re.search(r"\bdefault\b", doc) else None
            members.append((name, typing.Annotated[hints[name], tyro.conf.arg(help=doc, help_behavior_hint=hint)],
                            dataclasses.field(default=defaults[name])))
        group = dataclasses.make_dataclass(f"Args_{key}", members)
        group.__doc__ = title if title != key else ""  # the panel's subtitle (make_dataclass writes a signature there)
        groups.append((key, typing.Annotated[group, tyro.conf.OmitArgPrefixes],
                       dataclasses.field(default_factory=group)))
    return dataclasses.make_dataclass("GroupedArgs", groups)


def to_grouped(args: Args, grouped: type) -> object:
    return grouped(**{g.name: g.type.__origin__(**{f.name: getattr(args, f.name)
                                                      for f in dataclasses.fields(g.type.__origin__)})
                      for g in dataclasses.fields(grouped)})


def from_grouped(value: object) -> Args:
    return Args(**{k: v for g in dataclasses.fields(value) for k, v in dataclasses.asdict(getattr(value, g.name)).items()})


FLAGS_DOC = os.path.join("docs", "flags.md")  # relative to the repository root
FLAGS_START, FLAGS_END = "<!-- flags:start -->", "<!-- flags:end -->"


def with_flag_tables(page: str) -> str:
    """The page with the generated tables between its two markers."""
    return between_markers(page, FLAGS_START, FLAGS_END, flag_table_markdown())


if __name__ == "__main__":
    import sys

    # python -m continual.config.args --update-docs (from the repository root); --update-readme is its old name
    if sys.argv[1:] in (["--update-docs"], ["--update-readme"]):
        update_between_markers(FLAGS_DOC, FLAGS_START, FLAGS_END, flag_table_markdown())
    else:
        print(flag_table_markdown(), end="")
