"""A log dir's metadata files, beside its partition directories: Kafka's offset checkpoint files
(checkpoint.py), the log dir's identity in `kafkalog.meta.properties` (meta_properties.py), and one
file per topic with what a broker keeps in its metadata log (topic_metadata.py).
"""
