"""The turn pipeline every generating surface shares: template the
conversation, submit it, parse the reply into text, reasoning and tool calls."""
