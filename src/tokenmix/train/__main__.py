"""``python -m tokenmix.train [--config_path config/train_demo.yaml] [--section.field value ...]``: the same run as
``tokenmix train``, its summary logged; an error a user can hit is one line, as for every command."""

import argparse
import logging
import sys

from tokenmix._commands import configure_command_logging, run_command
from tokenmix.train.launch import launch, summary


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenmix.train", description=__doc__)
    parser.add_argument("--config_path", default="config/train_demo.yaml", help="a training config: data, trainer and model sections")
    args, overrides = parser.parse_known_args()
    config, result, picture = launch(args.config_path, overrides)
    for line in summary(result, config.trainer.checkpoint_dir, picture):
        logging.getLogger("tokenmix.train").info(line)
    return 0


configure_command_logging()
sys.exit(run_command("tokenmix.train", main))
