"""Files on disk, by content: the stage cache (temporary folder, rename when complete, manifest last;
file digests; weights linked into the artifact) and `llmopt verify` of an artifact against its manifest."""
