"""The six mock tools of MiniMind's agent tasks: their schemas and deterministic, offline implementations.

Results never come from live services: weather derives from a hash of the location, time from a fixed
instant (2025-03-07 06:30 UTC) and a table of UTC offsets, exchange rates and units from fixed tables,
translation from a small phrase table (else a tagged echo). A bad value (unknown unit, currency or
timezone, an expression the calculator refuses) raises ``ToolError`` with a message the model can read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from tools.safe_math import CalculationError, evaluate_expression


class ToolError(ValueError):
    """A tool refused its (schema-valid) arguments; the message becomes the error observation."""


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


TOOL_SCHEMAS: dict[str, dict] = {schema["function"]["name"]: schema for schema in (
    _function("calculate_math", "Evaluate an arithmetic expression",
              {"expression": {"type": "string"}}, ["expression"]),
    _function("unit_converter", "Convert a value between units of length, mass, volume or temperature",
              {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
              ["value", "from_unit", "to_unit"]),
    _function("get_current_weather", "Get the current weather of a location",
              {"location": {"type": "string"}}, ["location"]),
    _function("get_current_time", "Get the current date and time in a timezone",
              {"timezone": {"type": "string", "default": "Asia/Shanghai"}}, []),
    _function("get_exchange_rate", "Get the exchange rate between two currencies (ISO codes)",
              {"from_currency": {"type": "string"}, "to_currency": {"type": "string"}},
              ["from_currency", "to_currency"]),
    _function("translate_text", "Translate text into a target language",
              {"text": {"type": "string"}, "target_language": {"type": "string"}}, ["text", "target_language"]),
)}

REFERENCE_INSTANT = datetime(2025, 3, 7, 6, 30, tzinfo=timezone.utc)
TIMEZONE_OFFSETS_MINUTES = {
    "UTC": 0, "Asia/Shanghai": 480, "Asia/Hong_Kong": 480, "Asia/Singapore": 480, "Asia/Tokyo": 540,
    "Asia/Seoul": 540, "Asia/Kolkata": 330, "Asia/Dubai": 240, "Europe/London": 0, "Europe/Paris": 60,
    "Europe/Berlin": 60, "Europe/Moscow": 180, "America/New_York": -300, "America/Chicago": -360,
    "America/Los_Angeles": -480, "America/Sao_Paulo": -180, "Australia/Sydney": 660,
}
UNITS_PER_USD = {
    "USD": 1.0, "CNY": 7.21, "EUR": 0.92, "GBP": 0.79, "JPY": 150.2, "AUD": 1.53, "CAD": 1.36,
    "CHF": 0.88, "HKD": 7.82, "SGD": 1.34, "KRW": 1330.0, "INR": 83.1,
}
# unit alias -> (dimension, size in the dimension's base unit: metre, kilogram, litre)
_LINEAR_UNITS = {
    **dict.fromkeys(("m", "meter", "meters", "metre", "metres"), ("length", 1.0)),
    **dict.fromkeys(("km", "kilometer", "kilometers", "kilometre", "kilometres"), ("length", 1000.0)),
    **dict.fromkeys(("cm", "centimeter", "centimeters"), ("length", 0.01)),
    **dict.fromkeys(("mm", "millimeter", "millimeters"), ("length", 0.001)),
    **dict.fromkeys(("mi", "mile", "miles"), ("length", 1609.344)),
    **dict.fromkeys(("ft", "foot", "feet"), ("length", 0.3048)),
    **dict.fromkeys(("in", "inch", "inches"), ("length", 0.0254)),
    **dict.fromkeys(("yd", "yard", "yards"), ("length", 0.9144)),
    **dict.fromkeys(("kg", "kilogram", "kilograms"), ("mass", 1.0)),
    **dict.fromkeys(("g", "gram", "grams"), ("mass", 0.001)),
    **dict.fromkeys(("lb", "lbs", "pound", "pounds"), ("mass", 0.45359237)),
    **dict.fromkeys(("oz", "ounce", "ounces"), ("mass", 0.028349523125)),
    **dict.fromkeys(("t", "ton", "tons", "tonne", "tonnes"), ("mass", 1000.0)),
    **dict.fromkeys(("l", "liter", "liters", "litre", "litres"), ("volume", 1.0)),
    **dict.fromkeys(("ml", "milliliter", "milliliters"), ("volume", 0.001)),
    **dict.fromkeys(("gal", "gallon", "gallons"), ("volume", 3.785411784)),
}
# temperature alias -> (scale to kelvin, offset): kelvin = (value + offset) * scale
_TEMPERATURE_UNITS = {
    **dict.fromkeys(("c", "celsius", "°c"), (1.0, 273.15)),
    **dict.fromkeys(("f", "fahrenheit", "°f"), (5 / 9, 459.67)),
    **dict.fromkeys(("k", "kelvin"), (1.0, 0.0)),
}
WEATHER_CONDITIONS = ("sunny", "cloudy", "overcast", "light rain", "heavy rain", "snow", "windy", "foggy")
PHRASES = {
    ("你好世界", "english"): "Hello World", ("good morning", "chinese"): "早上好",
    ("今天天气真好", "english"): "The weather is nice today", ("i love programming", "chinese"): "我喜欢编程",
    ("thank you", "french"): "Merci", ("thank you", "german"): "Danke", ("hello", "spanish"): "Hola",
}


def _calculate_math(expression: str) -> dict:
    try:
        return {"result": evaluate_expression(expression)}
    except CalculationError as error:
        raise ToolError(str(error)) from None


def _unit_converter(value: float, from_unit: str, to_unit: str) -> dict:
    source, target = from_unit.strip().lower(), to_unit.strip().lower()
    if source in _TEMPERATURE_UNITS and target in _TEMPERATURE_UNITS:
        (scale_in, offset_in), (scale_out, offset_out) = _TEMPERATURE_UNITS[source], _TEMPERATURE_UNITS[target]
        result = (value + offset_in) * scale_in / scale_out - offset_out
    else:
        for unit in (source, target):
            if unit not in _LINEAR_UNITS and unit not in _TEMPERATURE_UNITS:
                raise ToolError(f"unknown unit '{unit}'")
        (dimension_in, size_in), (dimension_out, size_out) = (
            _LINEAR_UNITS.get(unit, ("temperature", 0.0)) for unit in (source, target))
        if dimension_in != dimension_out:
            raise ToolError(f"cannot convert {dimension_in} ({from_unit}) to {dimension_out} ({to_unit})")
        result = value * size_in / size_out
    return {"result": round(result, 6), "from_unit": from_unit, "to_unit": to_unit}


def _stable_fraction(text: str, salt: str) -> float:
    digest = hashlib.sha256(f"{salt}:{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _get_current_weather(location: str) -> dict:
    key = " ".join(location.lower().split())
    if not key:
        raise ToolError("location is empty")
    temperature = -15 + int(_stable_fraction(key, "temperature") * 54)
    condition = WEATHER_CONDITIONS[int(_stable_fraction(key, "condition") * len(WEATHER_CONDITIONS))]
    humidity = 20 + int(_stable_fraction(key, "humidity") * 76)
    return {"city": location, "temperature": f"{temperature}°C", "humidity": f"{humidity}%", "condition": condition}


def _get_current_time(timezone: str = "Asia/Shanghai") -> dict:
    names = {name.lower(): name for name in TIMEZONE_OFFSETS_MINUTES}
    name = names.get(timezone.strip().lower())
    if name is None:
        raise ToolError(f"unknown timezone '{timezone}' (known: {', '.join(TIMEZONE_OFFSETS_MINUTES)})")
    local = REFERENCE_INSTANT + timedelta(minutes=TIMEZONE_OFFSETS_MINUTES[name])
    return {"datetime": local.strftime("%Y-%m-%d %H:%M:%S"), "timezone": name}


def _get_exchange_rate(from_currency: str, to_currency: str) -> dict:
    source, target = from_currency.strip().upper(), to_currency.strip().upper()
    for code in (source, target):
        if code not in UNITS_PER_USD:
            raise ToolError(f"unknown currency '{code}' (known: {', '.join(UNITS_PER_USD)})")
    return {"from": source, "to": target, "rate": float(f"{UNITS_PER_USD[target] / UNITS_PER_USD[source]:.6g}")}


def _translate_text(text: str, target_language: str) -> dict:
    language = target_language.strip().lower()
    if not text.strip() or not language:
        raise ToolError("text and target_language must not be empty")
    translated = PHRASES.get((text.strip().lower(), language)) or PHRASES.get((text.strip(), language))
    return {"translated_text": translated or f"[{language}] {text}", "target_language": language}


IMPLEMENTATIONS: dict[str, Callable[..., dict]] = {
    "calculate_math": _calculate_math,
    "unit_converter": _unit_converter,
    "get_current_weather": _get_current_weather,
    "get_current_time": _get_current_time,
    "get_exchange_rate": _get_exchange_rate,
    "translate_text": _translate_text,
}


def tool_schemas(names: list[str] | None = None) -> list[dict]:
    """The OpenAI-style schemas of ``names`` (default: all six), in that order, for records' ``tools`` field."""
    return [TOOL_SCHEMAS[name] for name in (names or list(TOOL_SCHEMAS))]
