"""Finding the verl command in a shell script, without running the script.

verl's recipes are bash scripts: variables set at the top (``max_response_length=$((1024 * 8))``,
``MODEL_PATH=${MODEL_PATH:-"${HOME}/models/Qwen2.5-7B"}``, arrays of overrides), then one
``python3 -m verl.trainer.main_ppo`` command continued over many lines and ending in ``$@``. This
module reads as much of bash as such scripts use: quoting, line continuations, comments, variable
assignments (``export``, arrays), parameter expansion with defaults, arithmetic, positional
parameters and ``shift``, and pipes and redirections after the command. Nothing is executed:
command substitution other than ``$(pwd)`` and ``$(dirname "$0")`` is kept as written and
reported, and ``if`` blocks are read as if their branches ran (reported).
"""

from __future__ import annotations

import ast
import operator
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlcore.errors import UsageError

_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)(\+?)=")
_VERL_MODULE = re.compile(r"(?:^|\.)main_(?:ppo|dapo)$")
_VERL_FILE = re.compile(r"(?:^|/)main_(?:ppo|dapo)\.py$")
_OPENERS = {"if", "while", "until", "for", "case", "select"}
_CLOSERS = {"fi", "done", "esac"}
_PREFIX_KEYWORDS = {"then", "else", "do", "{", "!", "time"}
_DECLARATIONS = {"export", "declare", "typeset", "local", "readonly"}


class ScriptError(UsageError):
    """The script cannot be read as a verl launch script (its location in the message)."""


@dataclass
class Piece:
    text: str
    expand: bool  # a $-expansion (text is what follows the "$"), or literal text
    quoted: bool  # inside double quotes (no word splitting), or in single quotes/escaped (literal)


@dataclass
class Word:
    pieces: list[Piece]
    line: int

    def is_literal(self, text: str) -> bool:
        return all(not p.expand for p in self.pieces) and "".join(p.text for p in self.pieces) == text


@dataclass
class ArrayLiteral:
    """``NAME=( ... )``: the words between the parentheses."""

    name: str
    append: bool
    words: list[Word]
    line: int


@dataclass
class VerlCommand:
    """The verl training command found in a script, its override words already expanded."""

    module: str  # "verl.trainer.main_ppo", "recipe.dapo.main_dapo"
    words: list[tuple[str, str]]  # (override word, where it came from: "run.sh:42" or "command line")
    line: int
    ray_job_address: str | None = None  # `ray job submit --address ...` (or $RAY_ADDRESS) when it submits it
    ray_job: bool = False
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- lexing


class _Lexer:
    """Splits a script into commands: lists of words and array assignments, ending at a newline or
    a control operator. Words keep their quoting, so expansion can come later, in order."""

    def __init__(self, text: str, name: str) -> None:
        self.text, self.name, self.pos, self.line = text, name, 0, 1

    def error(self, message: str, line: int | None = None) -> ScriptError:
        return ScriptError(f"{self.name}:{line or self.line}: {message}")

    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.text[i] if i < len(self.text) else ""

    def advance(self, n: int = 1) -> str:
        chunk = self.text[self.pos : self.pos + n]
        self.line += chunk.count("\n")
        self.pos += n
        return chunk

    def commands(self):
        """Yields (items, line, separator) for each command, separator being the operator after it."""
        items: list = []
        start = self.line
        while True:
            self.skip_blanks()
            ch = self.peek()
            if not ch or ch == "\n" or ch == ";" or ch == "&" or ch == "|":
                separator = self.operator()
                if items:
                    yield items, start, separator
                items = []
                if not ch:
                    return
                start = self.line
                continue
            if ch == "#":
                while self.peek() and self.peek() != "\n":
                    self.advance()
                continue
            if ch in "()":
                self.advance()  # subshells and groups: their commands are read like any other
                continue
            if ch in "<>" or (ch.isdigit() and self.redirection_ahead()):
                self.redirection()
                continue
            if not items:
                start = self.line
            word = self.word()
            array = self.array_assignment(word)
            items.append(array if array is not None else word)

    def skip_blanks(self) -> None:
        while True:
            ch = self.peek()
            if ch in (" ", "\t", "\r"):
                self.advance()
            elif ch == "\\" and self.peek(1) == "\n":
                self.advance(2)
            else:
                return

    def operator(self) -> str:
        ch = self.peek()
        if not ch:
            return ""
        for op in ("&&", "||", ";;", "|&"):
            if self.text.startswith(op, self.pos):
                self.advance(len(op))
                return op
        self.advance()
        return ch

    def redirection_ahead(self) -> bool:
        i = self.pos
        while i < len(self.text) and self.text[i].isdigit():
            i += 1
        return i < len(self.text) and self.text[i] in "<>"

    def redirection(self) -> None:
        """``> file``, ``2>&1``, ``>> log``, ``< in``: skipped, with their target."""
        while self.peek().isdigit():
            self.advance()
        if self.text.startswith("<<", self.pos):
            raise self.error("here-documents are not read; put the verl command outside one")
        while self.peek() in ("<", ">"):
            self.advance()
        if self.peek() == "&":
            self.advance()
            while self.peek().isdigit() or self.peek() == "-":
                self.advance()
            return
        self.skip_blanks()
        if self.peek() and self.peek() not in "\n;&|":
            self.word()

    def word(self) -> Word:
        pieces: list[Piece] = []
        line = self.line
        literal: list[str] = []

        def flush(quoted: bool = False) -> None:
            if literal:
                pieces.append(Piece("".join(literal), expand=False, quoted=quoted))
                literal.clear()

        while True:
            ch = self.peek()
            if not ch or ch in " \t\r\n;&|()<>":
                break
            if ch == "\\":
                if self.peek(1) == "\n":
                    self.advance(2)
                    continue
                flush()
                self.advance()
                pieces.append(Piece(self.advance(), expand=False, quoted=True))
            elif ch == "'":
                flush()
                self.advance()
                end = self.text.find("'", self.pos)
                if end < 0:
                    raise self.error("a single quote is never closed", line)
                pieces.append(Piece(self.advance(end - self.pos), expand=False, quoted=True))
                self.advance()
            elif ch == '"':
                flush()
                self.advance()
                pieces.extend(self.double_quoted(line))
            elif ch == "$" or ch == "`":
                flush()
                expansion = self.expansion()
                if expansion is None:
                    literal.append(self.advance())
                else:
                    pieces.append(Piece(expansion, expand=True, quoted=False))
            else:
                literal.append(self.advance())
        flush()
        return Word(pieces, line)

    def double_quoted(self, line: int) -> list[Piece]:
        pieces: list[Piece] = []
        literal: list[str] = []
        while True:
            ch = self.peek()
            if not ch:
                raise self.error("a double quote is never closed", line)
            if ch == '"':
                self.advance()
                break
            if ch == "\\" and self.peek(1) in ('"', "\\", "$", "`", "\n"):
                self.advance()
                escaped = self.advance()
                if escaped != "\n":
                    literal.append(escaped)
            elif ch in "$`":
                expansion = self.expansion()
                if expansion is None:
                    literal.append(self.advance())
                else:
                    if literal:
                        pieces.append(Piece("".join(literal), expand=False, quoted=True))
                        literal.clear()
                    pieces.append(Piece(expansion, expand=True, quoted=True))
            else:
                literal.append(self.advance())
        if literal or not pieces:
            pieces.append(Piece("".join(literal), expand=False, quoted=True))
        return pieces

    def expansion(self) -> str | None:
        """The text of the expansion at a "$" (or backtick), consumed: ``{NAME:-x}``, ``((1+2))``,
        ``(cmd)``, ``NAME``, ``@``; None when the "$" is a plain character."""
        if self.peek() == "`":
            end = self.text.find("`", self.pos + 1)
            if end < 0:
                raise self.error("a backtick is never closed")
            inner = self.text[self.pos + 1 : end]
            self.advance(end + 1 - self.pos)
            return f"({inner})"
        nxt = self.peek(1)
        if nxt == "{":
            return "{" + self.balanced(self.pos + 1, "{", "}") + "}"
        if nxt == "(":
            return "(" + self.balanced(self.pos + 1, "(", ")") + ")"
        match = _NAME.match(self.text, self.pos + 1)
        if match:
            self.advance(1 + len(match.group()))
            return match.group()
        if nxt and nxt in "@*#?$!0123456789-":
            self.advance(2)
            return nxt
        return None

    def balanced(self, start: int, opening: str, closing: str) -> str:
        """The text between the bracket at ``start`` and its match (quotes respected); consumed,
        with the "$" before it."""
        depth, i, quote = 0, start, ""
        while i < len(self.text):
            ch = self.text[i]
            if quote:
                if ch == "\\" and quote == '"':
                    i += 2
                    continue
                if ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch == "\\":
                i += 2
                continue
            elif ch == opening:
                depth += 1
            elif ch == closing:
                depth -= 1
                if depth == 0:
                    inner = self.text[start + 1 : i]
                    self.advance(i + 1 - self.pos)
                    return inner
            i += 1
        raise self.error(f"'${opening}' is never closed")

    def array_assignment(self, word: Word) -> ArrayLiteral | None:
        """``NAME=(`` right after the word: read the array's words up to the closing parenthesis."""
        if self.peek() != "(" or len(word.pieces) != 1 or word.pieces[0].expand or word.pieces[0].quoted:
            return None
        match = _ASSIGNMENT.fullmatch(word.pieces[0].text)
        if not match:
            return None
        self.advance()
        words: list[Word] = []
        while True:
            while self.peek() in (" ", "\t", "\r", "\n") or (self.peek() == "\\" and self.peek(1) == "\n"):
                self.advance(2 if self.peek() == "\\" else 1)
            ch = self.peek()
            if not ch:
                raise self.error(f"the array {match.group(1)}=( is never closed", word.line)
            if ch == ")":
                self.advance()
                return ArrayLiteral(match.group(1), bool(match.group(2)), words, word.line)
            if ch == "#":
                while self.peek() and self.peek() != "\n":
                    self.advance()
                continue
            words.append(self.word())


# ----------------------------------------------------------------------------- expanding


_ARITH_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}


def _arith(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _arith(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):  # bash divides integers, truncating toward zero
            if right == 0:
                raise ValueError("division by zero")
            quotient = abs(left) // abs(right)
            return quotient if (left >= 0) == (right >= 0) else -quotient
        if type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](left, right)
    raise ValueError("only integer + - * / % ** arithmetic is read")


class Shell:
    """The variables and positional parameters of a script as it is read, top to bottom."""

    def __init__(
        self, name: str, script_path: str, args: Sequence[str], environ: Mapping[str, str], cwd: str
    ):
        self.name, self.script_path, self.cwd = name, script_path, cwd
        self.args = list(args)
        self.environ = dict(environ)
        self.variables: dict[str, str | list[str]] = {}
        self.conditional: dict[str, int] = {}  # variables set inside if/for/while blocks -> the line
        self.notes: list[str] = []

    def note(self, line: int, message: str) -> None:
        self.notes.append(f"{self.name}:{line}: {message}")

    def lookup(self, name: str) -> str | list[str] | None:
        if name in self.conditional:
            line = self.conditional.pop(name)
            self.note(
                line, f"{name} is set inside an if/for/while block and used later; read as if that branch ran"
            )
        if name in self.variables:
            return self.variables[name]
        if name == "PWD":
            return self.cwd
        return self.environ.get(name)

    # Words ---------------------------------------------------------------------------------

    def expand_word(self, word: Word, split: bool = True) -> list[str]:
        """The words ``word`` becomes: expansions substituted, unquoted ones split on blanks (when
        ``split``), ``"$@"`` and ``"${ARR[@]}"`` one word per element."""
        fields: list[str] = [""]
        started = False  # a quoted empty string still makes a word
        for piece in word.pieces:
            if not piece.expand:
                fields[-1] += piece.text
                started = started or piece.quoted or bool(piece.text)
                continue
            value = self.expansion(piece.text, word.line)
            # A command substitution is kept as written ("$(date +%s)"), and not split on its spaces.
            kept = isinstance(value, str) and "$(" in value
            if isinstance(value, list):  # "$@", "${ARR[@]}"
                if not value:
                    continue
                parts = value if piece.quoted or not split else [w for v in value for w in v.split()]
                if not parts:
                    continue
                fields[-1] += parts[0]
                fields.extend(parts[1:])
                started = True
            elif piece.quoted or not split or kept:
                fields[-1] += value
                started = True
            else:
                parts = value.split()
                if not parts:
                    continue
                if value[:1].isspace() and fields[-1]:
                    fields.append("")
                fields[-1] += parts[0]
                fields.extend(parts[1:])
                if value[-1:].isspace():
                    fields.append("")
                started = True
        if not started and fields == [""]:
            return []
        return [f for f in fields if f != ""] if len(fields) > 1 else fields

    def expand_text(self, word: Word) -> str:
        return " ".join(self.expand_word(word, split=False))

    def expansion(self, text: str, line: int) -> str | list[str]:
        if text.startswith("(("):
            return self.arithmetic(text[2:-2], line)
        if text.startswith("("):
            return self.command_substitution(text[1:-1], line)
        if text.startswith("{"):
            return self.parameter(text[1:-1], line)
        return self.simple(text, line)

    def simple(self, name: str, line: int) -> str | list[str]:
        if name in ("@", "*"):
            return list(self.args)
        if name == "#":
            return str(len(self.args))
        if name == "0":
            return self.script_path
        if name.isdigit():
            index = int(name)
            return self.args[index - 1] if index <= len(self.args) else ""
        if name in ("?", "$", "!", "-"):
            self.note(line, f"${name} has no value when the script is only read; taken as empty")
            return ""
        value = self.lookup(name)
        if value is None:
            return ""
        return value[0] if isinstance(value, list) and value else ("" if isinstance(value, list) else value)

    def parameter(self, body: str, line: int) -> str | list[str]:
        """``${...}``: NAME, #NAME, NAME[@], NAME[i], NAME:-word and the other default forms."""
        if body.startswith("#") and _NAME.fullmatch(body[1:]):
            value = self.lookup(body[1:])
            return str(len(value) if isinstance(value, list) else len(value or ""))
        match = re.match(r"([A-Za-z_]\w*|[0-9]+|[@*#])(\[([^\]]*)\])?", body)
        if not match:
            raise ScriptError(
                f"{self.name}:{line}: ${{{body}}} is not a parameter expansion this reader knows"
            )
        name, index = match.group(1), match.group(3)
        rest = body[match.end() :]
        if index is not None:
            array = self.lookup(name)
            elements = array if isinstance(array, list) else ([] if array is None else [array])
            if index in ("@", "*"):
                value: str | list[str] | None = list(elements)
            else:
                try:
                    position = int(self.arithmetic(index, line))
                except ScriptError:
                    position = -1
                value = elements[position] if 0 <= position < len(elements) else ""
        elif name.isdigit() or name in ("@", "*", "#"):
            value = self.simple(name, line)
        else:
            value = self.lookup(name)
        if not rest:
            return "" if value is None else value
        op = re.match(r":?[-=+?]", rest)
        if not op:
            self.note(
                line,
                f"${{{body}}}: only the default forms (:-, -, :=, =, :+, +) are read; taken as ${{{name}}}",
            )
            return "" if value is None else value
        operator_text, word_text = op.group(), rest[op.end() :]
        is_set = value is not None and (not operator_text.startswith(":") or value not in ("", []))
        kind = operator_text[-1]
        if kind == "+":
            return self.expand_inner(word_text, line) if is_set else ""
        if is_set:
            return value  # type: ignore[return-value]
        if kind == "?":
            raise ScriptError(
                f"{self.name}:{line}: ${{{body}}}: {name} is not set, and the script requires it"
            )
        default = self.expand_inner(word_text, line)
        if kind == "=":
            self.variables[name] = default
        return default

    def expand_inner(self, text: str, line: int) -> str:
        """A word inside ``${NAME:-word}``: its quotes and expansions, as one string."""
        lexer = _Lexer(text, self.name)
        lexer.line = line
        pieces: list[Piece] = []
        while lexer.peek():
            if lexer.peek() in " \t":
                pieces.append(Piece(lexer.advance(), expand=False, quoted=True))
                continue
            if lexer.peek() in ";&|()<>":  # no meaning inside a default: literal
                pieces.append(Piece(lexer.advance(), expand=False, quoted=True))
                continue
            pieces.extend(lexer.word().pieces)
        return self.expand_text(Word(pieces, line))

    def arithmetic(self, expression: str, line: int) -> str:
        text = self.expand_inner(expression, line) if "$" in expression else expression

        def name_value(match: re.Match) -> str:
            value = self.lookup(match.group())
            value = value[0] if isinstance(value, list) and value else value
            return str(value).strip() if value not in (None, "", []) else "0"

        for _ in range(8):  # a variable may hold a name or an expression
            replaced = _NAME.sub(name_value, text)
            if replaced == text:
                break
            text = replaced
        try:
            return str(_arith(ast.parse(text.strip(), mode="eval")))
        except (SyntaxError, ValueError) as exc:
            raise ScriptError(f"{self.name}:{line}: $(({expression})) cannot be computed: {exc}") from None

    def command_substitution(self, command: str, line: int) -> str:
        stripped = command.strip()
        if stripped == "pwd":
            return self.cwd
        if re.fullmatch(r"dirname\s+\"?\$\{?0\}?\"?", stripped):
            return str(Path(self.script_path).parent)
        self.note(line, f"$({stripped}) is not run (the script is only read): kept as written")
        return f"$({stripped})"

    # Commands ------------------------------------------------------------------------------

    def assign(self, word: Word, line: int, conditional: bool) -> bool:
        """``NAME=value`` (or ``NAME+=value``): set it and return True; False if ``word`` is not one."""
        first = word.pieces[0] if word.pieces else None
        if first is None or first.expand or first.quoted:
            return False
        match = _ASSIGNMENT.match(first.text)
        if not match:
            return False
        rest = [Piece(first.text[match.end() :], expand=False, quoted=False), *word.pieces[1:]]
        value = self.expand_text(Word(rest, line))
        name = match.group(1)
        if match.group(2):
            old = self.lookup(name)
            value = (old if isinstance(old, str) else " ".join(old or [])) + value
        self.set(name, value, line, conditional)
        return True

    def set(self, name: str, value: str | list[str], line: int, conditional: bool) -> None:
        if conditional:
            self.conditional[name] = line
        else:
            self.conditional.pop(name, None)
        self.variables[name] = value

    def assign_array(self, array: ArrayLiteral, conditional: bool) -> None:
        values = [w for word in array.words for w in self.expand_word(word)]
        if array.append:
            old = self.lookup(array.name)
            values = (old if isinstance(old, list) else ([old] if old else [])) + values
        self.set(array.name, values, array.line, conditional)


def find_verl_command(
    text: str,
    *,
    name: str,
    script_path: str = "",
    args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> VerlCommand:
    """The ``python3 -m verl.trainer.main_ppo ...`` command of a script (the first, when there are
    several), its words expanded as bash would expand them at that point. ``args`` are the script's
    positional parameters (``$1``, ``$@``), ``environ`` the environment it starts from."""
    shell = Shell(
        name, script_path or name, args, os.environ if environ is None else environ, cwd or os.getcwd()
    )
    depth = 0
    found: VerlCommand | None = None
    others: list[int] = []
    for items, line, _separator in _Lexer(text, name).commands():
        words = [i for i in items if isinstance(i, Word)]
        while words and any(words[0].is_literal(k) for k in _PREFIX_KEYWORDS):
            items = items[items.index(words[0]) + 1 :]
            words = words[1:]
        if not items:
            continue
        head = next((w for w in words if not _is_assignment(w)), None)
        head_text = (
            "".join(p.text for p in head.pieces) if head and not any(p.expand for p in head.pieces) else ""
        )
        if head_text in _OPENERS:
            depth += 1
            continue
        if head_text in _CLOSERS:
            depth = max(0, depth - 1)
            continue
        if head_text in ("elif",):
            continue
        conditional = depth > 0
        if head is None:  # only assignments: the script's variables
            for item in items:
                if isinstance(item, ArrayLiteral):
                    shell.assign_array(item, conditional)
                else:
                    shell.assign(item, line, conditional)
            continue
        if head_text in _DECLARATIONS:
            for item in items[items.index(head) + 1 :]:
                if isinstance(item, ArrayLiteral):
                    shell.assign_array(item, conditional)
                elif isinstance(item, Word) and not shell.assign(item, line, conditional):
                    pass  # "export NAME" or a flag such as -x: nothing to read
            continue
        if head_text == "unset":
            for item in words[1:]:
                shell.variables.pop(shell.expand_text(item), None)
            continue
        if head_text == "shift":
            count = int(shell.expand_text(words[1])) if len(words) > 1 else 1
            shell.args = shell.args[count:]
            continue
        if head_text in ("source", "."):
            shell.note(
                line,
                f"{head_text} {' '.join(shell.expand_text(w) for w in words[1:])}: that file is not read",
            )
            continue
        expanded: list[tuple[str, str]] = []
        for word in words[words.index(head) :]:
            origin = "command line" if _is_all_args(word) else f"{name}:{word.line}"
            expanded.extend((w, origin) for w in shell.expand_word(word))
        command = _verl_invocation(expanded, shell, line)
        if command is None:
            continue
        if found is None:
            found = command
        else:
            others.append(line)
    if found is None:
        raise ScriptError(
            f"{name}: no verl training command found (python3 -m verl.trainer.main_ppo ..., or a main_dapo); "
            "give its overrides on the command line instead"
        )
    if others:
        shell.note(
            found.line,
            f"the script runs more verl commands (lines {', '.join(map(str, others))}); the first is read",
        )
    found.notes = shell.notes
    return found


def _is_assignment(word: Word) -> bool:
    first = word.pieces[0] if word.pieces else None
    return (
        first is not None
        and not first.expand
        and not first.quoted
        and _ASSIGNMENT.match(first.text) is not None
    )


def _is_all_args(word: Word) -> bool:
    """``$@``, ``"$@"``, ``$*`` or ``${@}``: the words given after the script."""
    return len(word.pieces) == 1 and word.pieces[0].expand and word.pieces[0].text in ("@", "*", "{@}", "{*}")


def _verl_invocation(words: list[tuple[str, str]], shell: Shell, line: int) -> VerlCommand | None:
    texts = [w for w, _ in words]
    start = None
    module = ""
    for i, text in enumerate(texts):
        if text == "-m" and i + 1 < len(texts) and _VERL_MODULE.search(texts[i + 1]):
            start, module = i + 2, texts[i + 1]
            break
        if _VERL_FILE.search(text):
            start, module = i + 1, text
            break
    if start is None:
        return None
    command = VerlCommand(module=module, words=words[start:], line=line)
    if texts[:3] == ["ray", "job", "submit"]:
        command.ray_job = True
        command.ray_job_address = _option_value(texts[3:start], "--address")
        if command.ray_job_address is None:
            address = shell.lookup("RAY_ADDRESS")
            command.ray_job_address = address if isinstance(address, str) and address else None
    return command


def _option_value(texts: list[str], option: str) -> str | None:
    for i, text in enumerate(texts):
        if text == option and i + 1 < len(texts):
            return texts[i + 1]
        if text.startswith(option + "="):
            return text[len(option) + 1 :]
    return None
