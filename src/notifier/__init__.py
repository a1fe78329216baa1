"""notifier: notification fan-out and delivery on trio, Postgres and RabbitMQ."""

__version__ = "0.1.0"
