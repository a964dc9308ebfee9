"""The checkout's tools (make demo, make chaos, the Composer deploy, the local stack); those that import another
module of the checkout (sim, local_airflow) run as ``python -m scripts.NAME``."""
