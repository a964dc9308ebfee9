"""MaxText RL post-training on GKE TPU slices, from Airflow: the package every Airflow component imports.

Installed as the distribution ``tpu-rl`` (a wheel): the scheduler, DAG processor, workers, triggerer and
API server import it from site-packages, and Airflow finds its Training tab (entry point
``airflow.plugins``) and its provider metadata (entry point ``apache_airflow_provider``) there. Importing
this module imports nothing else: the plugin manager loads it in every component.
"""

#: The one version of the distribution: the wheel's, and the one task logs, the plan and the Training tab show.
__version__ = "2.9.0"
