"""RabbitMQ: pure topology names (``topology``), the aiormq wrapper (``amqp``), shared types."""
