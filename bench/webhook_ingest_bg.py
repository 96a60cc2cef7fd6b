"""Keeps the Dagster pipeline busy while the webhook bench loads the receiver: a real instance
ticks delivery_sensor and executes the index_batch runs it asks for, against the bench database,
until its deadline (bounded: it stops by itself). Run by `webhook_load.py --with-ingestion`.

    DATABASE_URL=… EMBEDDING_PROVIDER=hash python bench/webhook_ingest_bg.py SECONDS
"""

import sys
import time

if __name__ == "__main__" and len(sys.argv) < 2:  # `make bench` runs every bench/*.py: nothing to do alone
    raise SystemExit(0)

import dagster as dg  # noqa: E402



def main(seconds: float) -> None:
    from rag_pipeline.definitions import defs as build

    defs = build()
    sensor = defs.resolve_sensor_def("delivery_sensor")
    job = defs.resolve_job_def("index_batch")
    deadline = time.monotonic() + seconds
    ticks = runs = 0
    with dg.instance_for_test() as instance:
        while time.monotonic() < deadline:
            with dg.build_sensor_context(instance=instance, resources=defs.resources) as context:
                result = sensor(context)
            ticks += 1
            for request in result.dynamic_partitions_requests or []:
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            for request in result.run_requests or []:
                if time.monotonic() >= deadline:
                    break
                job.execute_in_process(run_config=request.run_config, instance=instance, tags=request.tags)
                runs += 1
                # The bench stops this process at its own end: the last line must be current.
                print(f"ingestion: {ticks} sensor ticks, {runs} index_batch runs so far", flush=True)
            print(f"ingestion: {ticks} sensor ticks, {runs} index_batch runs so far", flush=True)
            if not result.run_requests:
                time.sleep(0.2)
    print(f"ingestion: {ticks} sensor ticks, {runs} index_batch runs in {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]))
