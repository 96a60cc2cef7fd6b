import dagster as dg

# One partition per normalized URL; Dagster recommends at most ~100k partitions per asset.
pages_partitions = dg.DynamicPartitionsDefinition(name="pages")
