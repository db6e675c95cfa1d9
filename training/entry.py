"""Common ``main()`` of the stage entrypoints: parse config, init the process group, map errors
to exit codes (see :mod:`training.exit_codes`)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from training.config import ConfigError, RunConfig, load_run_config, split_cli
from training.exit_codes import BAD_INPUT, FAILED


def run_main(stage: str, run: Callable[..., int], argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        path, overrides = split_cli(argv)
        cfg: RunConfig = load_run_config(path, overrides)
    except ConfigError as err:
        print(f"ragpool {stage}: config error: {err}", file=sys.stderr)
        return BAD_INPUT
    from training import distributed as D
    from training.data import DataError

    env = D.init_distributed(cfg.device)
    try:
        return run(cfg, env)
    except (ConfigError, DataError) as err:
        print(f"ragpool {stage} [rank {env.rank}]: bad input: {err}", file=sys.stderr)
        return BAD_INPUT
    except Exception:
        traceback.print_exc()
        return FAILED
    finally:
        D.destroy()
