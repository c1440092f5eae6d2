"""A worker process for the pause test: `accord worker`'s own composition
(:func:`accord.commands.worker.serve`) serving a test-only class with a deterministic handler.

Run as ``python -m tests.faults.worker_proc --journal PATH ...`` with ACCORD_PG_DSN,
ACCORD_DEMO_PROVIDER_URL and ACCORD_OBJECT_DIR in the environment. The handler prints
``computing job=J generation=G`` when it starts, then *finishes its work whatever happens*
(shielded from the worker's cancellation, as a handler that must complete its computation
would): it sleeps ``--compute-s``, calls the provider as an effect (``--mode effect``) or
not (``--mode publish``), stores the report body and attempts the fenced publish. Whether
that publish may commit is the fence's decision alone.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import anyio

from accord import runtime
from accord.commands.worker import WorkerOptions, serve
from accord.demo.app import settings as demo_settings
from accord.demo.catalog import ReportAcceptedV1
from accord.demo.job import DEFAULT_OWNER, create_at_provider, publish_report, render_report
from accord.demo.provider import ProviderClient
from accord.jobs.runner import Handler, JobContext, Registered, WorkerConfig
from accord.schemas.settings import load_settings

WORKFLOW = "report_paused"


def paused_handler(provider: ProviderClient, mode: str, compute_s: float) -> Handler:
    async def handle(ctx: JobContext) -> None:
        request = ReportAcceptedV1.model_validate(ctx.payload)
        lease = ctx.lease
        print(f"computing job={lease.job_id} generation={lease.generation}", flush=True)
        with anyio.CancelScope(shield=True):
            await anyio.sleep(compute_s)
            receipt = None
            if mode == "effect":
                receipt = await create_at_provider(ctx, provider, request)
            key = await ctx.put_object(render_report(ctx, request, receipt))
            print(f"publishing job={lease.job_id} generation={lease.generation}", flush=True)
            await ctx.publish(publish_report(ctx, request, key, receipt), object_key=key)
            print(f"published job={lease.job_id} generation={lease.generation}", flush=True)

    return handle


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", required=True)
    parser.add_argument("--mode", choices=("effect", "publish"), default="effect")
    parser.add_argument("--compute-s", type=float, default=1.0)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--rescue-every-s", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    settings = load_settings()
    provider = ProviderClient(demo_settings().provider_url, timeout_s=5.0)
    options = WorkerOptions(
        workflow=WORKFLOW,
        journal=Path(args.journal),
        config=WorkerConfig(
            owner=DEFAULT_OWNER,
            concurrency=1,
            lease_s=args.lease_s,
            poll_s=0.1,
            rescue_every_s=args.rescue_every_s or None,
            grace_s=10.0,
        ),
    )
    handler = paused_handler(provider, args.mode, args.compute_s)
    return int(runtime.run(serve, settings, options, [Registered(WORKFLOW, handler, 60.0)]))


if __name__ == "__main__":
    sys.exit(main())
