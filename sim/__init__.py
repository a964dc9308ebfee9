"""The local simulation: a real Kubernetes control plane with the JobSet controller and simulated TPU nodes, a
Cloud Storage front before fake-gcs-server, the GKE API emulator and the MaxText emulator
(docs/explanation/simulation.md).

A package: its modules import each other relatively and run as ``python -m sim.NAME`` from the checkout
(sim/up.sh and ``control_plane.ControlPlane`` put the checkout on ``PYTHONPATH``)."""
