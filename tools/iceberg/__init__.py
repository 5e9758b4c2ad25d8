"""Iceberg's Java side for the tests: its REST catalog server and its Spark runtime, from Maven Central."""
