"""The PySpark Python Data Source for kafkalog (option parsing, planning, Arrow conversion)."""
