"""MiniMind's six mock agent tools: their schemas, tables and results, as MiniMind's agent training defines them.

Source: jingyaogong/minimind ``trainer/train_agent.py`` (master d65ef2c; the tool code is unchanged since
101d7df), whose ``TOOLS``, data tables and mock results trained the ``agent_768`` teacher and produced the
``gt`` values of ``agent_rl.jsonl``; MiniMind's on-policy distillation (``trainer/agent_opd_utils.py``) runs
these same tools. The schemas are MiniMind's literally (they are rendered into the system prompt).

Each implementation takes the call's ``arguments`` object as it is and reads it the way MiniMind's does:
missing keys take MiniMind's defaults, keys it does not read are ignored, values are used as given (no
schema check). A key not in a table gets MiniMind's default result (22°C 晴, 2025-03-07 14:30:00, rate 1.0,
factor 1, the text itself). Whatever makes MiniMind's Python raise raises here too: ``TypeError`` (an
unhashable value as a table key, ``float(None)``), ``ValueError`` (``float("abc")``), ``AttributeError``
(``.lower()`` of a non-string unit), ``OverflowError``, and ``CalculationError`` for an expression the safe
calculator refuses or Python fails on (``tools.safe_math``; MiniMind calls ``eval``, this never does).
"""

from __future__ import annotations

from collections.abc import Callable

from tools.safe_math import CalculationError, evaluate_expression


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


TOOL_SCHEMAS: dict[str, dict] = {schema["function"]["name"]: schema for schema in (
    _function("calculate_math", "计算数学表达式", {"expression": {"type": "string"}}, ["expression"]),
    _function("unit_converter", "单位换算",
              {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
              ["value", "from_unit", "to_unit"]),
    _function("get_current_weather", "获取天气", {"location": {"type": "string"}}, ["location"]),
    _function("get_current_time", "获取时间", {"timezone": {"type": "string", "default": "Asia/Shanghai"}}, []),
    _function("get_exchange_rate", "查询汇率", {"from_currency": {"type": "string"}, "to_currency": {"type": "string"}},
              ["from_currency", "to_currency"]),
    _function("translate_text", "翻译文本", {"text": {"type": "string"}, "target_language": {"type": "string"}},
              ["text", "target_language"]),
)}

# location -> (temperature, condition); humidity is always 65%
WEATHER = {
    "北京": ("28°C", "晴"), "上海": ("15°C", "多云"), "广州": ("32°C", "闷热"), "深圳": ("30°C", "晴"),
    "杭州": ("22°C", "阴"), "成都": ("18°C", "小雨"), "武汉": ("25°C", "多云"), "南京": ("20°C", "晴"),
    "西安": ("16°C", "大风"), "重庆": ("26°C", "阴"), "Tokyo": ("12°C", "晴"), "New York": ("8°C", "多云"),
    "London": ("5°C", "小雨"), "Paris": ("10°C", "阴"), "Sydney": ("25°C", "晴朗"),
}
DEFAULT_WEATHER = ("22°C", "晴")
HUMIDITY = "65%"
LOCAL_TIMES = {
    "Asia/Shanghai": "2025-03-07 14:30:00", "America/New_York": "2025-03-07 01:30:00",
    "Europe/London": "2025-03-07 06:30:00", "Asia/Tokyo": "2025-03-07 15:30:00",
    "Europe/Paris": "2025-03-07 07:30:00", "Australia/Sydney": "2025-03-07 17:30:00",
}
DEFAULT_TIMEZONE = "Asia/Shanghai"
DEFAULT_TIME = "2025-03-07 14:30:00"
EXCHANGE_RATES = {
    ("USD", "CNY"): 7.21, ("EUR", "CNY"): 7.85, ("GBP", "CNY"): 9.12, ("JPY", "CNY"): 0.048,
    ("USD", "EUR"): 0.92, ("USD", "GBP"): 0.79, ("CNY", "JPY"): 20.83, ("AUD", "CNY"): 4.72,
}
DEFAULT_RATE = 1.0
TRANSLATIONS = {
    ("你好世界", "english"): "Hello World", ("Good morning", "chinese"): "早上好",
    ("今天天气真好", "english"): "The weather is nice today", ("I love programming", "chinese"): "我喜欢编程",
    ("机器学习很有趣", "english"): "Machine learning is interesting", ("Happy birthday", "chinese"): "生日快乐",
}
# "{from_unit}_{to_unit}" lower-cased -> factor; the result is value * factor (temperatures too: no offset)
UNIT_FACTORS = {
    "km_miles": 0.621371, "miles_km": 1.60934, "kg_pounds": 2.20462, "pounds_kg": 0.453592,
    "meters_feet": 3.28084, "feet_meters": 0.3048, "celsius_fahrenheit": 1.8, "fahrenheit_celsius": 0.5556,
}
DEFAULT_FACTOR = 1
# MiniMind's rewrites of an expression before it is evaluated
EXPRESSION_REWRITES = str.maketrans({"^": "**", "×": "*", "÷": "/", "−": "-", "（": "(", "）": ")"})


def math_expression(arguments: dict) -> str:
    """The text ``calculate_math`` evaluates: ``expression`` (default ``"0"``, any JSON value turned into text by
    ``str``) after MiniMind's rewrites."""
    return str(arguments.get("expression", "0")).translate(EXPRESSION_REWRITES)


def calculate_math(arguments: dict) -> dict:
    """``{"result": str(value)}`` of ``math_expression(arguments)``."""
    value = evaluate_expression(math_expression(arguments))
    try:
        return {"result": str(value)}
    except ValueError as error:  # an int of more than 4,300 digits: Python refuses to print it
        raise CalculationError(str(error)) from None


def unit_converter(arguments: dict) -> dict:
    """``{"result": round(float(value) * factor, 4)}``; an unknown unit pair has factor 1."""
    value = float(arguments.get("value", 0))
    pair = f"{arguments.get('from_unit', '').lower()}_{arguments.get('to_unit', '').lower()}"
    return {"result": round(value * UNIT_FACTORS.get(pair, DEFAULT_FACTOR), 4)}


def get_current_weather(arguments: dict) -> dict:
    """The location's weather (the default for any other location); ``city`` echoes ``location`` as given."""
    location = arguments.get("location")
    temperature, condition = WEATHER.get(location, DEFAULT_WEATHER)
    return {"city": location, "temperature": temperature, "humidity": HUMIDITY, "condition": condition}


def get_current_time(arguments: dict) -> dict:
    """The fixed local time of the timezone (default Asia/Shanghai); ``timezone`` echoes it as given."""
    timezone = arguments.get("timezone", DEFAULT_TIMEZONE)
    return {"datetime": LOCAL_TIMES.get(timezone, DEFAULT_TIME), "timezone": timezone}


def get_exchange_rate(arguments: dict) -> dict:
    """The rate of the exact (from, to) pair, 1.0 for any other pair; the codes are echoed as given."""
    source, target = arguments.get("from_currency"), arguments.get("to_currency")
    return {"from": source, "to": target, "rate": EXCHANGE_RATES.get((source, target), DEFAULT_RATE)}


def translate_text(arguments: dict) -> dict:
    """The table's translation of the exact (text, target_language) pair, else the text itself (default "")."""
    text, language = arguments.get("text"), arguments.get("target_language")
    return {"translated_text": TRANSLATIONS.get((text, language), arguments.get("text", ""))}


IMPLEMENTATIONS: dict[str, Callable[[dict], dict]] = {
    "calculate_math": calculate_math,
    "unit_converter": unit_converter,
    "get_current_weather": get_current_weather,
    "get_current_time": get_current_time,
    "get_exchange_rate": get_exchange_rate,
    "translate_text": translate_text,
}
# what a failing tool raises (MiniMind's Python raises the same for the same arguments)
TOOL_FAILURES = (TypeError, ValueError, AttributeError, ArithmeticError)


def tool_schemas(names: list[str] | None = None) -> list[dict]:
    """MiniMind's schemas of ``names`` (default: all six), in that order, for records' ``tools`` field."""
    return [TOOL_SCHEMAS[name] for name in (names or list(TOOL_SCHEMAS))]
