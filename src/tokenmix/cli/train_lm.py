"""``tokenmix train``: train the tiny transformer of ``tokenmix.train`` on a data config's mixture, evaluating every
source, checkpointing, and resuming from the run directory's checkpoint; draws ``train.png`` there at the end.

    tokenmix train --config_path config/train_demo.yaml [--trainer.num_train_steps 400] [--data.seed 1] ...
"""

from __future__ import annotations

import os

from tokenmix.cli.console import make_console
from tokenmix.cli.parser import CommandParser

TRAIN_DEMO = os.path.join("config", "train_demo.yaml")


def run(argv: list[str]) -> int:
    parser = CommandParser("train", __doc__)
    parser.add_argument("--config_path", default=TRAIN_DEMO, help="a training config: data, trainer and model sections")
    args, overrides = parser.parse_known_args(argv)
    from tokenmix.train.launch import launch, summary

    config, result, picture = launch(args.config_path, overrides)
    console = make_console()
    for line in summary(result, config.trainer.checkpoint_dir, picture):
        console.print(line)
    return 0
