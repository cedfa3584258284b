"""``tokenmix plot``: draw a mixture config's schedule (each source's share of the examples by step) as a PNG,
before any training, or a run's weight log (``--weight_log run/weights.jsonl``); a training config's data section is
drawn with its trainer's batch sizes.

    tokenmix plot --config_path config/demo.yaml --steps 1000 --out schedule.png
"""

from __future__ import annotations

import logging

from tokenmix.cli.console import make_console
from tokenmix.cli.parser import CommandParser, at_least

logger = logging.getLogger(__name__)


def run(argv: list[str]) -> int:
    parser = CommandParser("plot", __doc__)
    parser.add_argument("--config_path", required=True, help="a mixture config, or a training config with a data section")
    parser.add_argument("--steps", type=at_least(1, "training steps"), default=1000, help="training steps drawn")
    parser.add_argument("--out", default="schedule.png", help="the PNG file written")
    parser.add_argument("--weight_log", default=None, help="a run's weights.jsonl: draw its stages instead of the config's")
    args, overrides = parser.parse_known_args(argv)
    from tokenmix.config.loading import load_data_config
    from tokenmix.config.mixture import LMMixtureDatasetConfig
    from tokenmix.train.plots import plot_schedule

    config = load_data_config(args.config_path, overrides)
    if not isinstance(config, LMMixtureDatasetConfig):
        logger.error("%s is a single-source config: it has no mixture schedule to draw", args.config_path)
        return 1
    log = None
    if args.weight_log is not None:
        from tokenmix.train.weight_log import read_log_file, stages

        log = stages(read_log_file(args.weight_log))
    make_console().print(f"wrote {plot_schedule(config, args.steps, args.out, log)}")
    return 0
