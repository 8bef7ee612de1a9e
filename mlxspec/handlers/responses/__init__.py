"""``/v1/responses`` (OpenAI Responses): input items, output items,
and the store of responses."""
