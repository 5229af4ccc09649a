"""Varied tool prompts for the Qwen tool-calling test: (user message, the tool a sensible call uses)."""

from __future__ import annotations


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


AGENT_TOOLS = [
    _fn("get_weather", "Get the current weather for a city",
        {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _fn("convert_currency", "Convert an amount of money from one currency to another",
        {"amount": {"type": "number"}, "from_currency": {"type": "string"}, "to_currency": {"type": "string"}},
        ["amount", "from_currency", "to_currency"]),
    _fn("search_web", "Search the web and return the top results", {"query": {"type": "string"}}, ["query"]),
    _fn("get_time", "Get the current time in an IANA time zone", {"timezone": {"type": "string"}}, ["timezone"]),
    _fn("send_email", "Send an email",
        {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
        ["to", "subject", "body"]),
    _fn("read_file", "Read a text file from the workspace", {"path": {"type": "string"}}, ["path"]),
    _fn("run_shell", "Run a shell command in the workspace and return its output",
        {"command": {"type": "string"}}, ["command"]),
]

CLEAR_CASES = [
    ("What is the weather in Paris? Use the tool.", "get_weather"),
    ("Is it raining in London right now?", "get_weather"),
    ("Tell me the temperature in Tokyo in fahrenheit.", "get_weather"),
    ("How warm is it in Cairo today?", "get_weather"),
    ("Convert 100 US dollars to euros.", "convert_currency"),
    ("How many Japanese yen is 50 British pounds?", "convert_currency"),
    ("I need 2500 CHF in USD, what do I get?", "convert_currency"),
    ("Search the web for the latest Python release.", "search_web"),
    ("Find news articles about the Mars rover.", "search_web"),
    ("Look up who won the 2022 World Cup.", "search_web"),
    ("What time is it in New York? Use the tool.", "get_time"),
    ("Give me the current time in Europe/Berlin.", "get_time"),
    ("What's the local time in Asia/Kolkata?", "get_time"),
    ("Send an email to bob@example.com with subject 'Lunch' saying I'll be late.", "send_email"),
    ("Email alice@example.com: subject 'Report', body 'The report is attached.'", "send_email"),
    ("Read the file src/main.py.", "read_file"),
    ("Show me what's in README.md.", "read_file"),
    ("Open config/settings.yaml and show it to me.", "read_file"),
    ("Run `ls -la` in the workspace.", "run_shell"),
    ("Run the tests with the command `pytest -q`.", "run_shell"),
]
