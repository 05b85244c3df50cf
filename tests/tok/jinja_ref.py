#!/usr/bin/env python3
"""The chat template reference: Python Jinja2 set up as Hugging Face
transformers sets it up (written for accumd from transformers' documented
behaviour): ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols, generation]),
`raise_exception`, `tojson` as json.dumps(ensure_ascii=False, ...),
`strftime_now`.

  jinja_ref.py cases OUT.jsonl NAME=TEMPLATE_FILE[:BOS:EOS] ...
      writes the test cases: every template on every conversation with
      add_generation_prompt true and false, plus the interpreter's construct
      templates;
  jinja_ref.py render CASES.jsonl > REF.jsonl
      renders each case: {"id", "out"} or {"id", "error"}.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


CONVERSATIONS = [
    [{"role": "system", "content": "You are a careful assistant."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"},
     {"role": "assistant", "content": "6, of course."}],
    [{"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Hi. How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "system", "content": "  padded system \n"},
     {"role": "user", "content": "\n\n  leading and trailing whitespace  \n"},
     {"role": "assistant", "content": " \tanswer with spaces\t \n\n"}],
    [{"role": "user", "content": "Ünïcödé: 日本語, emoji 👩‍👩‍👧 🇫🇷, quotes ' \" and {{ braces }} {% x %}"},
     {"role": "assistant", "content": "Reçu: «ok» — fine."}],
    [{"role": "user", "content": "Think first."},
     {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nThe answer."},
     {"role": "user", "content": "Again?"},
     {"role": "assistant", "content": "Sure."}],
    [{"role": "user", "content": "single question"}],
]

# Constructs of the interpreter, each rendered by both implementations.
CONSTRUCTS = [
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
    "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}|{% endfor %}",
    "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>"
    "{{ loop.nextitem.role if loop.nextitem is defined else '-' }} {% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }};{% else %}none{% endfor %}",
    "{% for m in [] %}x{% else %}empty{% endfor %}",
    "{% for k, v in {'a': 1, 'b': [1, 2]}.items() %}{{ k }}={{ v }},{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set x %}block {{ 1 + 2 }}{% endset %}[{{ x }}]",
    "{% macro turn(role, text='default', end='!') %}<{{ role }}:{{ text }}{{ end }}>{% endmacro %}{{ turn('u') }}{{ turn('a', 'hi') }}{{ turn('s', end='?') }}",
    "{{ messages[::-1][0].role }} {{ messages[-1].content }} {{ messages[1:3] | length }} {{ 'abcdef'[::-2] }} {{ 'abcdef'[1:-1] }} {{ [1,2,3,4][::-1] }} {{ 'héllo'[1:3] }}",
    "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 / 3 }} {{ 2.5 * 2 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-5 }} {{ 3 - 5 }} {{ 'a' ~ 1 ~ none }}",
    "{{ true }} {{ none }} {{ 1.0 }} {{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }} {{ ('t', 1) }} {{ \"it's\" }} {{ ['it\\'s', 'a\\nb'] }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 'a' in 'cat' }} {{ 'x' not in ['x'] }} {{ 'k' in {'k': 1} }} {{ not 0 and 1 or 2 }} {{ 3 if false }}|{{ 'y' if 1 else 'n' }} {{ 2 == 2.0 }} {{ 'b' > 'a' }}",
    "{{ '  a b  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ messages | length }}|{{ 'héllo' | count }}|{{ undefined_var | default('dflt') }}|{{ '' | default('e', true) }}|{{ [3,1,2] | first }}{{ [3,1,2] | last }}|{{ [1,2,3] | join('-') }}|{{ 'MiXed wORDS' | lower }} {{ 'MiXed wORDS' | upper }} {{ 'miXed wORDS' | capitalize }} {{ 'hello big-world (x)' | title }}",
    "{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 12 | string }} {{ '42' | int + 1 }} {{ '4.5' | float }} {{ 'x' | int }} {{ 3.9 | int }} {{ 'ab' | list }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ [1, 2] | reverse | list }}",
    "{{ messages | map(attribute='role') | join(',') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | list }} {{ [0, 1, '', 'x'] | select | list }}",
    "{{ {'b': 1, 'a': 2} | items | list }} {{ {'b': 1, 'A': 2, 'c': 0} | dictsort }} {{ 'x' | safe }} {{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(3, true) }}",
    "{{ messages[0] | tojson }}|{{ {'b': [1, 2.5, none, true], 'a': 'ü\"\\n'} | tojson(indent=2) }}|{{ {'b': 1, 'a': {}} | tojson(sort_keys=true) }}|{{ [1, [2, []]] | tojson(separators=(',', ':')) }}|{{ 'x' | tojson }}",
    "{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.5 is float }} {{ true is boolean }} {{ true is true }} {{ 0 is false }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ 2 is equalto 2 }} {{ 2 is eq(3) }} {{ 'a' is in 'abc' }} {{ 3 is odd }} {{ 3 is even }} {{ 9 is divisibleby 3 }} {{ 1 is not none }}",
    "{{ '\\n\\n x \\n'.strip() }}|{{ 'xyhixy'.strip('xy') }}|{{ '\\n\\nhi'.lstrip('\\n') }}|{{ 'hi\\n\\n'.rstrip('\\n') }}|{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }}|{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a b c'.split(maxsplit=1) }}|{{ 'aXbX'.replace('X', '-') }} {{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ 'hello world'.title() }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ ', '.join(['a', 'b']) }}",
    "{% set d = {'a': 1, 'b': 2} %}{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }} {{ d.a }} {{ d['b'] }} {{ d.zz is defined }}",
    "  {% if true %}\n    lstrip and trim\n  {% endif %}\n{# comment #}\n  {%+ if true %}plus{% endif %}\n  {{ 'var keeps' }}\n{%- if true -%}   minus   {%- endif -%}\n{{- ' tight ' -}}\n  end {% if false %}x{% elif 1 %}elif{% else %}y{% endif %}\n  {#- c -#}  after\n",
    "{% for m in messages %}{% generation %}[{{ m.role }}]{% endgeneration %}{% endfor %}",
    "{{ bos_token }}{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
    "line1\r\nline2\n",
]

VARS = {"bos_token": "<s>", "eos_token": "</s>"}


def make_cases(out, specs):
    cases = []
    for spec in specs:
        name, rest = spec.split("=", 1)
        parts = rest.split(":")
        path = parts[0]
        bos = parts[1] if len(parts) > 1 else ""
        eos = parts[2] if len(parts) > 2 else ""
        with open(path, encoding="utf-8") as f:
            src = f.read()
        if path.endswith(".json"):
            src = json.loads(src)["chat_template"]
            if isinstance(src, list):
                src = next(t["template"] for t in src if t["name"] == "default")
        for ci, conv in enumerate(CONVERSATIONS):
            for agp in (False, True):
                cases.append({"id": f"{name}/conv{ci}/agp={int(agp)}", "template": src,
                              "vars": {"messages": conv, "add_generation_prompt": agp,
                                       "tools": None, "documents": None,
                                       "bos_token": bos, "eos_token": eos}})
    for ci, src in enumerate(CONSTRUCTS):
        for vi, conv in enumerate(CONVERSATIONS[:2]):
            cases.append({"id": f"construct{ci}/conv{vi}", "template": src,
                          "vars": dict(VARS, messages=conv)})
    with open(out, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")


def render(path):
    env = environment()
    with open(path, encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            try:
                out = {"id": c["id"], "out": env.from_string(c["template"]).render(**c["vars"])}
            except jinja2.exceptions.TemplateError as e:
                out = {"id": c["id"], "error": str(e)}
            sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "cases":
        make_cases(sys.argv[2], sys.argv[3:])
    else:
        render(sys.argv[2])
