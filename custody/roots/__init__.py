"""Composition roots of the custody processes, one per process, each built only from a
`custody.config.DeploymentConfig`:

| root | process | holds |
| --- | --- | --- |
| `custody.roots.api.ApiRoot` (`build_api_root`) | `python -m custody api` | the HTTP app's services and the matching sequencer; no scheduler |
| `custody.roots.worker.WorkerRoot` (`build_worker_root`) | `python -m custody worker` | the scheduled jobs: deposits, payouts, sweeps, rebalances, reconciliation, matching snapshots |
| (signer) | `python -m signer serve` | the seed; see signer/ |

What both share (engine, adapters, the signer client, reference data) is in `custody.roots.common`;
what they keep checking while they run (each node's chain, the signer's keys) in `custody.roots.guards`.
No root imports `signer.keys` or `signer.service`: custody processes never hold key material.
`custody.container.Container` remains the in-process wiring of the tests and the `serve` demo.
"""
