"""One self-contained file per algorithm. Each module has `train(args, curriculum, resume_state)` and
`make_agent(obs_space, n_actions, args)`; `AGENT_MODULES` maps `--architecture` to its module."""

AGENT_MODULES = {
    "PPO": "agents.ppo",
    "IMPALA": "agents.impala",
    "CLEAR": "agents.clear",
    "PPO_CBP": "agents.ppo_cbp",
    "DQN": "agents.dqn",
    "A2C": "agents.a2c",
    "PNC": "agents.pnc",
}
