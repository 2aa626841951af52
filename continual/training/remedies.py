"""The end of a run says which remedies it asked for did nothing (a run identical to its baseline is not a bug)."""

from __future__ import annotations


def idle_remedies(args, state: dict) -> list[str]:
    """One line per remedy the run asked for that did nothing, from the final checkpoint's `state` (printed at the
    end of the run, so that a run identical to its baseline is not taken for a bug): CBP that replaced no unit,
    methods acting at switches in a run without a switch, ReDo / layer resets / plasticity injection that never
    came due."""
    notes: list[str] = []
    model = state.get("model") or {}
    replaced = [int(v) for k, v in model.items() if k.startswith("cbp.") and k.endswith(".replaced")]
    if replaced and sum(replaced) == 0:
        ages = [int(v.max()) for k, v in model.items() if k.startswith("cbp.") and k.endswith(".age") and v.numel()]
        owed = [float(v) for k, v in model.items() if k.startswith("cbp.") and k.endswith(".to_replace")]
        notes.append(f"CBP replaced 0 units in {max(ages, default=0):,} optimizer updates: --replacement_rate "
                     f"{args.replacement_rate:g} x the units older than --maturity_threshold {args.maturity_threshold} "
                     f"adds up to {max(owed, default=0.0):.2f} of a unit per layer, so this run trained as plain PPO")
    if state.get("switches", 0) == 0:
        at_switches = [flag for flag, on in (
            ("--shrink_and_perturb", args.shrink_and_perturb),
            ("--reset_optimizer_on_switch", args.reset_optimizer_on_switch),
            (f"--ewc {args.ewc}", args.ewc != "none"),
            ("--redo (at switches)", args.redo and not args.redo_every),
            ("--reset_layers (at switches)", bool(args.reset_layers) and not args.reset_every),
            ("--plasticity_injection at_switches", args.plasticity_injection == "at_switches"),
            ("--reset_replay_on_switch", args.reset_replay_on_switch),
            ("--epsilon_rewarm_on_switch", args.epsilon_rewarm_on_switch)) if on]
        if at_switches:
            notes.append(f"{', '.join(at_switches)} did nothing: {'they act' if len(at_switches) > 1 else 'it acts'} "
                         f"at regime switches and this run had none in its {state.get('global_step', 0):,} steps")
    else:
        ewc = state.get("ewc")
        if args.ewc != "none" and isinstance(ewc, dict) and not ewc.get("consolidated"):
            notes.append(f"--ewc {args.ewc} never consolidated: no observation was stored before any of the "
                         f"run's switches")
    methods = state.get("plasticity_methods")
    if isinstance(methods, dict):
        for flag, on, count in (("--redo_every", args.redo and args.redo_every, "redo_count"),
                                ("--reset_every", args.reset_layers and args.reset_every, "reset_count"),
                                ("--plasticity_injection", args.plasticity_injection in ("every", "step"),
                                 "inject_count")):
            if on and methods.get(count) == 0:
                notes.append(f"{flag} never came due in this run's {state.get('global_step', 0):,} steps: the "
                             f"method did nothing")
    return notes
