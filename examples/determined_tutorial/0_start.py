"""Stage 0 of the Core API tutorial: an ordinary training loop, not yet talking to the cluster.

The "model" is a counter: each batch adds ``increment_by`` to ``x``. On the cluster this runs as
any entrypoint does; the lines it logs are the trial's logs.
"""

import logging
import time

import determined as det

BATCHES = 100


def train(increment_by: int) -> int:
    x = 0
    for batch in range(BATCHES):
        x += increment_by
        time.sleep(0.01)
        logging.info("batch %d: x=%d", batch + 1, x)
    return x


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    train(increment_by=1)
