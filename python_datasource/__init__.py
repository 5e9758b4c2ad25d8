"""The PySpark Python Data Source for kafkalog: option parsing, planning and Arrow conversion only.

Open data_source.py first (the user guide and the entry points), then options.py / source_options.py,
reader.py + planning.py (reads), writer.py (the sink) and errors.py (how errors reach a Spark user);
all log logic is in storage/.
"""
