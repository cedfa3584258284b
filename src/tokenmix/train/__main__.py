"""``python -m tokenmix.train [--config_path config/train_demo.yaml] [--section.field value ...]``: the same run as
``tokenmix train``, its summary logged."""

import argparse
import logging

from tokenmix._command_logging import configure_command_logging
from tokenmix.train.launch import launch, summary

configure_command_logging()
parser = argparse.ArgumentParser(prog="python -m tokenmix.train", description=__doc__)
parser.add_argument("--config_path", default="config/train_demo.yaml", help="a training config: data, trainer and model sections")
args, overrides = parser.parse_known_args()
config, result, picture = launch(args.config_path, overrides)
for line in summary(result, config.trainer.checkpoint_dir, picture):
    logging.getLogger("tokenmix.train").info(line)
