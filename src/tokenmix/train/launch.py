"""Launching a training run from a config file: fake CPU devices when asked for, the run's processes joined, the run,
its picture (drawn by process 0, which writes the run's files)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenmix.loader.cpu_devices import use_fake_cpu_devices
from tokenmix.train.config import TrainLmConfig, load_train_config


def launch(config_path: str, overrides: Sequence[str] = ()) -> tuple[TrainLmConfig, object, str | None]:
    """Train (or resume) the run ``config_path`` describes, as one of its ``trainer.num_processes`` processes; returns the
    config, the ``TrainResult`` and the path of the run's picture (``train.png`` in its directory; None in a process
    other than 0, which draws it)."""
    config = load_train_config(config_path, overrides)
    if config.trainer.cpu_devices:
        use_fake_cpu_devices(config.trainer.cpu_devices)  # before JAX starts its backend
    from tokenmix.train.loop import train
    from tokenmix.train.plots import plot_run
    from tokenmix.train.processes import is_writer, join_processes

    join_processes(config.trainer)
    result = train(config)
    return config, result, plot_run(config) if is_writer() else None


def summary(result, run_dir: str, picture: str | None) -> list[str]:
    """What a finished run reports, line by line."""
    if not result.steps:
        lines = [f"nothing to train: {run_dir} has trained {result.first_step} steps, all that trainer.num_train_steps asks for; "
                 "raise it (--trainer.num_train_steps N) to train further"]
    else:
        lines = [f"trained steps {result.first_step} to {result.first_step + result.steps - 1}: final training loss "
                 f"{result.final_loss:.3f}; waiting for data took {100 * result.data_wait_share:.2f}% of step time"]
    lines += [f"  validation loss {name:<12} {loss:.3f}" for name, loss in result.validation.items()]
    if picture is None:
        lines.append(f"process 0 writes the checkpoint, metrics.jsonl and train.png in {run_dir}")
    else:
        lines.append(f"checkpoint, metrics.jsonl and {picture.rsplit('/', 1)[-1]} are in {run_dir}")
    return lines
