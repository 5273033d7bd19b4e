"""Google's Gemini API (``/v1beta/models/<model>:generateContent`` and friends), what Gemini CLI speaks."""
