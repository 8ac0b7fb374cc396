"""MiniMind's mock tools: the schemas literally, and the exact observation of calls inside and outside its tables.

Every expected string below was derived by reading jingyaogong/minimind trainer/train_agent.py at master d65ef2c
(``TOOLS``, ``WEATHER_DATA``, ``TIME_DATA``, ``EXCHANGE_DATA``, ``TRANSLATE_DATA``, ``UNIT_DATA``,
``MOCK_RESULTS``; the tool code is unchanged since 101d7df) and trainer/agent_opd_utils.py ``tool_observation``
(public code index, 1855c78): the observation is ``json.dumps(result, ensure_ascii=False)[:2048]``, or
``{"error": "unknown tool or invalid arguments"}`` when the tool raises.
"""

from __future__ import annotations

import json

import pytest

from tools.mock_tools import TOOL_SCHEMAS, tool_schemas
from tools.tool_calls import ToolCall
from tools.tool_environment import execute_call

ALL = frozenset(TOOL_SCHEMAS)
ERROR = '{"error": "unknown tool or invalid arguments"}'

# MiniMind's TOOLS, as train_agent.py writes them (d65ef2c)
MINIMIND_TOOLS_JSON = (
    '[{"type": "function", "function": {"name": "calculate_math", "description": "计算数学表达式", "parameters": '
    '{"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}, '
    '{"type": "function", "function": {"name": "unit_converter", "description": "单位换算", "parameters": '
    '{"type": "object", "properties": {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": '
    '{"type": "string"}}, "required": ["value", "from_unit", "to_unit"]}}}, '
    '{"type": "function", "function": {"name": "get_current_weather", "description": "获取天气", "parameters": '
    '{"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}, '
    '{"type": "function", "function": {"name": "get_current_time", "description": "获取时间", "parameters": '
    '{"type": "object", "properties": {"timezone": {"type": "string", "default": "Asia/Shanghai"}}, "required": []}}}, '
    '{"type": "function", "function": {"name": "get_exchange_rate", "description": "查询汇率", "parameters": '
    '{"type": "object", "properties": {"from_currency": {"type": "string"}, "to_currency": {"type": "string"}}, '
    '"required": ["from_currency", "to_currency"]}}}, '
    '{"type": "function", "function": {"name": "translate_text", "description": "翻译文本", "parameters": '
    '{"type": "object", "properties": {"text": {"type": "string"}, "target_language": {"type": "string"}}, '
    '"required": ["text", "target_language"]}}}]'
)


def test_schemas_are_minimind_literally_key_order_included():
    assert json.dumps(tool_schemas(), ensure_ascii=False) == MINIMIND_TOOLS_JSON
    assert [s["function"]["name"] for s in tool_schemas(["translate_text", "calculate_math"])] == [
        "translate_text", "calculate_math"]


def weather(city, temperature: str, condition: str) -> str:
    return json.dumps({"city": city, "temperature": temperature, "humidity": "65%", "condition": condition},
                      ensure_ascii=False)


OBSERVATIONS = [
    # calculate_math: str() of the value after MiniMind's rewrites; math.* only (eval without builtins)
    ("calculate_math", {"expression": "2^10"}, '{"result": "1024"}'),
    ("calculate_math", {"expression": "（2+3）×4"}, '{"result": "20"}'),
    ("calculate_math", {"expression": "9÷4"}, '{"result": "2.25"}'),
    ("calculate_math", {"expression": "5−8"}, '{"result": "-3"}'),
    ("calculate_math", {"expression": "10/3"}, '{"result": "3.3333333333333335"}'),
    ("calculate_math", {"expression": "0.1+0.2"}, '{"result": "0.30000000000000004"}'),
    ("calculate_math", {"expression": "2^100"}, '{"result": "1267650600228229401496703205376"}'),
    ("calculate_math", {"expression": "math.sqrt(2)"}, '{"result": "1.4142135623730951"}'),
    ("calculate_math", {"expression": "math.sin(math.pi/6)"}, '{"result": "0.49999999999999994"}'),
    ("calculate_math", {"expression": "math.log(100, 10)"}, '{"result": "2.0"}'),
    ("calculate_math", {"expression": "7 // 2 + 7 % 2"}, '{"result": "4"}'),
    ("calculate_math", {"expression": "(-8)**(1/3)"}, '{"result": "(1.0000000000000002+1.7320508075688772j)"}'),
    ("calculate_math", {"expression": "1e308*10"}, '{"result": "inf"}'),
    ("calculate_math", {"expression": 12}, '{"result": "12"}'),  # str() of a JSON number
    ("calculate_math", {}, '{"result": "0"}'),  # default expression "0"
    ("calculate_math", {"expression": "1/0"}, ERROR),
    ("calculate_math", {"expression": "sqrt(16)"}, ERROR),  # no builtins: a bare name fails
    ("calculate_math", {"expression": "abs(-2)"}, ERROR),
    ("calculate_math", {"expression": "math.pow(2，3)"}, ERROR),  # the full-width comma is not rewritten
    ("calculate_math", {"expression": ""}, ERROR),
    ("calculate_math", {"expression": "10^4300"}, ERROR),  # Python prints at most 4,300 digits
    # unit_converter: round(float(value) * UNIT_DATA.get(f"{from}_{to}".lower(), 1), 4), a float
    ("unit_converter", {"value": 10, "from_unit": "km", "to_unit": "miles"}, '{"result": 6.2137}'),
    ("unit_converter", {"value": "2.5", "from_unit": "miles", "to_unit": "km"}, '{"result": 4.0233}'),
    ("unit_converter", {"value": 5, "from_unit": "KG", "to_unit": "Pounds"}, '{"result": 11.0231}'),
    ("unit_converter", {"value": 150, "from_unit": "pounds", "to_unit": "kg"}, '{"result": 68.0388}'),
    ("unit_converter", {"value": 7, "from_unit": "meters", "to_unit": "feet"}, '{"result": 22.9659}'),
    ("unit_converter", {"value": 3, "from_unit": "feet", "to_unit": "meters"}, '{"result": 0.9144}'),
    ("unit_converter", {"value": 100, "from_unit": "celsius", "to_unit": "fahrenheit"}, '{"result": 180.0}'),
    ("unit_converter", {"value": 98.6, "from_unit": "fahrenheit", "to_unit": "celsius"}, '{"result": 54.7822}'),
    ("unit_converter", {"value": 3, "from_unit": "m", "to_unit": "cm"}, '{"result": 3.0}'),  # not in the table
    ("unit_converter", {"value": 2, "from_unit": "miles", "to_unit": "meters"}, '{"result": 2.0}'),
    ("unit_converter", {"value": True, "from_unit": "km", "to_unit": "miles"}, '{"result": 0.6214}'),
    ("unit_converter", {}, '{"result": 0.0}'),  # value 0, unit pair "_"
    ("unit_converter", {"value": "abc", "from_unit": "km", "to_unit": "miles"}, ERROR),
    ("unit_converter", {"value": None, "from_unit": "km", "to_unit": "miles"}, ERROR),
    ("unit_converter", {"value": 1, "from_unit": 5, "to_unit": "miles"}, ERROR),  # 5 .lower()
    ("unit_converter", {"value": [1], "from_unit": "km", "to_unit": "miles"}, ERROR),
    # get_current_weather: exact keys; 22°C 晴 for anything else; city echoes the location as given
    ("get_current_weather", {"location": "北京"}, weather("北京", "28°C", "晴")),
    ("get_current_weather", {"location": "广州"}, weather("广州", "32°C", "闷热")),
    ("get_current_weather", {"location": "西安"}, weather("西安", "16°C", "大风")),
    ("get_current_weather", {"location": "New York"}, weather("New York", "8°C", "多云")),
    ("get_current_weather", {"location": "Sydney"}, weather("Sydney", "25°C", "晴朗")),
    ("get_current_weather", {"location": "Beijing"}, weather("Beijing", "22°C", "晴")),
    ("get_current_weather", {"location": "tokyo"}, weather("tokyo", "22°C", "晴")),
    ("get_current_weather", {"location": 5}, '{"city": 5, "temperature": "22°C", "humidity": "65%", "condition": "晴"}'),
    ("get_current_weather", {}, '{"city": null, "temperature": "22°C", "humidity": "65%", "condition": "晴"}'),
    ("get_current_weather", {"location": ["北京"]}, ERROR),  # unhashable table key
    # get_current_time: default Asia/Shanghai; 14:30 for any other timezone, echoed as given
    ("get_current_time", {}, '{"datetime": "2025-03-07 14:30:00", "timezone": "Asia/Shanghai"}'),
    ("get_current_time", {"timezone": "Asia/Tokyo"}, '{"datetime": "2025-03-07 15:30:00", "timezone": "Asia/Tokyo"}'),
    ("get_current_time", {"timezone": "America/New_York"},
     '{"datetime": "2025-03-07 01:30:00", "timezone": "America/New_York"}'),
    ("get_current_time", {"timezone": "Australia/Sydney"},
     '{"datetime": "2025-03-07 17:30:00", "timezone": "Australia/Sydney"}'),
    ("get_current_time", {"timezone": "UTC"}, '{"datetime": "2025-03-07 14:30:00", "timezone": "UTC"}'),
    ("get_current_time", {"timezone": "asia/tokyo"}, '{"datetime": "2025-03-07 14:30:00", "timezone": "asia/tokyo"}'),
    ("get_current_time", {"timezone": None}, '{"datetime": "2025-03-07 14:30:00", "timezone": null}'),
    ("get_current_time", {"timezone": {"name": "UTC"}}, ERROR),
    # get_exchange_rate: the exact pair, else 1.0 (reverse pairs included)
    ("get_exchange_rate", {"from_currency": "USD", "to_currency": "CNY"}, '{"from": "USD", "to": "CNY", "rate": 7.21}'),
    ("get_exchange_rate", {"from_currency": "JPY", "to_currency": "CNY"}, '{"from": "JPY", "to": "CNY", "rate": 0.048}'),
    ("get_exchange_rate", {"from_currency": "CNY", "to_currency": "JPY"}, '{"from": "CNY", "to": "JPY", "rate": 20.83}'),
    ("get_exchange_rate", {"from_currency": "AUD", "to_currency": "CNY"}, '{"from": "AUD", "to": "CNY", "rate": 4.72}'),
    ("get_exchange_rate", {"from_currency": "CNY", "to_currency": "USD"}, '{"from": "CNY", "to": "USD", "rate": 1.0}'),
    ("get_exchange_rate", {"from_currency": "usd", "to_currency": "cny"}, '{"from": "usd", "to": "cny", "rate": 1.0}'),
    ("get_exchange_rate", {}, '{"from": null, "to": null, "rate": 1.0}'),
    ("get_exchange_rate", {"from_currency": ["USD"], "to_currency": "CNY"}, ERROR),
    # translate_text: the exact (text, language) pair, else the text itself ("" when missing)
    ("translate_text", {"text": "你好世界", "target_language": "english"}, '{"translated_text": "Hello World"}'),
    ("translate_text", {"text": "Happy birthday", "target_language": "chinese"}, '{"translated_text": "生日快乐"}'),
    ("translate_text", {"text": "机器学习很有趣", "target_language": "english"},
     '{"translated_text": "Machine learning is interesting"}'),
    ("translate_text", {"text": "Good morning", "target_language": "Chinese"}, '{"translated_text": "Good morning"}'),
    ("translate_text", {"text": "Bonjour", "target_language": "english"}, '{"translated_text": "Bonjour"}'),
    ("translate_text", {"target_language": "english"}, '{"translated_text": ""}'),
    ("translate_text", {"text": {"a": 1}, "target_language": "english"}, ERROR),
]


@pytest.mark.parametrize("name,arguments,observation", OBSERVATIONS)
def test_observation_is_minimind_s(name, arguments, observation):
    assert execute_call(ToolCall(name, arguments), ALL).observation == observation


def test_every_table_entry_is_minimind_s():
    cities = {"北京": ("28°C", "晴"), "上海": ("15°C", "多云"), "广州": ("32°C", "闷热"), "深圳": ("30°C", "晴"),
              "杭州": ("22°C", "阴"), "成都": ("18°C", "小雨"), "武汉": ("25°C", "多云"), "南京": ("20°C", "晴"),
              "西安": ("16°C", "大风"), "重庆": ("26°C", "阴"), "Tokyo": ("12°C", "晴"), "New York": ("8°C", "多云"),
              "London": ("5°C", "小雨"), "Paris": ("10°C", "阴"), "Sydney": ("25°C", "晴朗")}
    for city, (temperature, condition) in cities.items():
        assert execute_call(ToolCall("get_current_weather", {"location": city}), ALL).observation == weather(
            city, temperature, condition)
    times = {"Asia/Shanghai": "14:30", "America/New_York": "01:30", "Europe/London": "06:30", "Asia/Tokyo": "15:30",
             "Europe/Paris": "07:30", "Australia/Sydney": "17:30"}
    for zone, clock in times.items():
        result = execute_call(ToolCall("get_current_time", {"timezone": zone}), ALL).result
        assert result == {"datetime": f"2025-03-07 {clock}:00", "timezone": zone}
    rates = {("USD", "CNY"): 7.21, ("EUR", "CNY"): 7.85, ("GBP", "CNY"): 9.12, ("JPY", "CNY"): 0.048,
             ("USD", "EUR"): 0.92, ("USD", "GBP"): 0.79, ("CNY", "JPY"): 20.83, ("AUD", "CNY"): 4.72}
    for (source, target), rate in rates.items():
        result = execute_call(ToolCall("get_exchange_rate", {"from_currency": source, "to_currency": target}), ALL)
        assert result.observation == f'{{"from": "{source}", "to": "{target}", "rate": {rate}}}'
    factors = {("km", "miles"): "621371.0", ("miles", "km"): "1609340.0", ("kg", "pounds"): "2204620.0",
               ("pounds", "kg"): "453592.0", ("meters", "feet"): "3280840.0", ("feet", "meters"): "304800.0",
               ("celsius", "fahrenheit"): "1800000.0", ("fahrenheit", "celsius"): "555600.0"}
    for (source, target), million_times_factor in factors.items():
        arguments = {"value": 10**6, "from_unit": source, "to_unit": target}
        assert execute_call(ToolCall("unit_converter", arguments), ALL).observation == (
            f'{{"result": {million_times_factor}}}')
    translations = {("你好世界", "english"): "Hello World", ("Good morning", "chinese"): "早上好",
                    ("今天天气真好", "english"): "The weather is nice today", ("I love programming", "chinese"): "我喜欢编程",
                    ("机器学习很有趣", "english"): "Machine learning is interesting", ("Happy birthday", "chinese"): "生日快乐"}
    for (text, language), translated in translations.items():
        result = execute_call(ToolCall("translate_text", {"text": text, "target_language": language}), ALL)
        assert result.result == {"translated_text": translated}


def test_keys_minimind_does_not_read_are_ignored():
    # MiniMind's tools read the arguments object with .get: an extra key changes nothing, a missing one defaults
    call = ToolCall("get_current_weather", {"location": "上海", "unit": "celsius", "days": 3})
    assert execute_call(call, ALL).observation == weather("上海", "15°C", "多云")
