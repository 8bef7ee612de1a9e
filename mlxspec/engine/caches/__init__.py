"""KV caches kept between requests: the RAM prompt cache, its SSD tier,
and the KV helpers both use."""
