"""What one process delivers to InfluxDB 1.6.7 while its threads log as fast as they can.

Python runs one thread at a time: callers that never pause share the interpreter
with the sender, which delivers what its share lets it encode; the rest is
dropped `buffer_full`, counted. For 1, 2, 4 and 8 spinning threads, each logging
for a few seconds: points logged, stored (read back), dropped, and the rate the
sender delivered while they spun.
"""

from __future__ import annotations

import sys
import threading
import time

from _common import influx_v1_logger
from servers import influxdb_v1

from telemetry_client import BufferSettings

SPIN_SECONDS = 4.0
THREADS = tuple(int(n) for n in sys.argv[1:]) or (1, 2, 4, 8)
FIELDS = {f"field_{k}": k * 1.5 for k in range(10)}


def run(url: str, database: str, threads: int) -> dict[str, float]:
    logger = influx_v1_logger(url, database, BufferSettings(max_items=50_000, batch_items=5_000))
    logged = [0] * threads
    stop = time.monotonic() + SPIN_SECONDS

    def spin(index: int) -> None:
        count, ts = 0, 1_700_000_000_000_000_000 + index * 10**15
        while time.monotonic() < stop:
            for _ in range(100):
                logger.log("busy", {"thread": str(index)}, FIELDS, timestamp=ts + count)
                count += 1
        logged[index] = count

    workers = [threading.Thread(target=spin, args=(i,)) for i in range(threads)]
    start = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    spun = time.monotonic() - start
    sent_while_spinning = logger.stats()["sent"]
    assert logger.flush(120) == 0
    stats = logger.stats()
    logger.close(1)
    return {
        "logged": sum(logged),
        "sent": stats["sent"],
        "dropped": stats["dropped"],
        "rate": sent_while_spinning / spun,
    }


def main() -> None:
    print(f"threads logging 10-field points without pause for {SPIN_SECONDS:.0f} s, InfluxDB 1.6.7 on loopback")
    print(f"{'threads':>7} {'logged':>10} {'stored':>10} {'dropped':>10} {'delivered while spinning':>26}")
    with influxdb_v1() as server:
        for threads in THREADS:
            database = f"busy{threads}"
            server.create_database(database)
            result = run(server.url, database, threads)
            stored = server.rows('SELECT count("field_0") FROM "busy"', database)[0]["count"]
            assert stored == result["sent"], (stored, result)
            print(
                f"{threads:>7} {result['logged']:>10,} {stored:>10,} {result['dropped']:>10,} "
                f"{result['rate']:>19,.0f} pts/s"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
