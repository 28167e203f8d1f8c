/**
 * GPU sizes as users type them (docs/users/sizes.md), mirrored from `jupyter_gpushare/core/sizes.py` so the
 * picker refuses what the server would refuse before anything is sent.
 *
 * Pure and dependency-free: `tests/unit/test_labextension_sizes.py` runs this module's
 * compiled form in Node against the Python parser on the same inputs (fixed examples and
 * random strings) and requires the same verdict and the same byte count. Arithmetic is exact
 * (BigInt), as Python's Decimal is. The rules (see `sizes.py`): ASCII digits only, ASCII
 * whitespace around a size ignored and none inside, amounts rounded up to whole MiB.
 */

export const MiB = 1024 ** 2;
export const GiB = 1024 ** 3;

export const ACCEPTED_FORMS =
  'accepted forms: 4G, 4g, 4GB, 4GiB or 0.5G (GiB); 512M, 512MB or 512MiB (MiB); ' +
  'a bare integer such as 4096 (MiB); a share of the device such as 25%; ' +
  "or 'whole' for a whole card";

const UNITS: { [unit: string]: bigint } = {
  g: BigInt(GiB),
  gb: BigInt(GiB),
  gib: BigInt(GiB),
  m: BigInt(MiB),
  mb: BigInt(MiB),
  mib: BigInt(MiB)
};

// Python's whitespace (str.isspace), not JavaScript's `\s`: none may appear inside a size.
const PYTHON_SPACE =
  '[\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const WS = new RegExp(PYTHON_SPACE);
// Around a size, ASCII whitespace is ignored (Python's `strip(" \\t\\n\\r\\f\\v")`).
const STRIP = /^[\t\n\v\f\r ]+|[\t\n\v\f\r ]+$/g;
// A decimal digit other than 0-9 (Python's str.isdecimal).
const OTHER_DIGIT = /(?![0-9])\p{Nd}/u;
const NUMBER = '([0-9]+(?:\\.[0-9]+)?|\\.[0-9]+)';
const AMOUNT = new RegExp(`^${NUMBER}([A-Za-z]*)$`);
const PERCENT = new RegExp(`^${NUMBER}%$`);

/**
 * A size that parsed: bytes, a share of the device in percent, or a whole card.
 */
export type ParsedSize =
  | { ok: true; form: 'bytes'; bytes: number; text: string }
  | { ok: true; form: 'percent'; percent: number; text: string }
  | { ok: true; form: 'whole'; text: 'whole' };

/**
 * A size that did not parse: the problem, and the message shown (the accepted forms follow
 * where the form is what is wrong, as the server's do).
 */
export interface ISizeError {
  ok: false;
  problem: string;
  message: string;
}

function refuse(problem: string, forms = true): ISizeError {
  return {
    ok: false,
    problem,
    message: forms ? `${problem}; ${ACCEPTED_FORMS}` : problem
  };
}

/** A decimal numeral as an exact fraction `numerator / 10 ** decimals`. */
function fraction(numeral: string): { numerator: bigint; scale: bigint } {
  const [whole, part = ''] = numeral.split('.');
  return {
    numerator: BigInt((whole || '0') + part),
    scale: BigInt(10) ** BigInt(part.length)
  };
}

/** Python's `repr` of a str, for messages that quote what was typed (as the server's do). */
function quote(text: string): string {
  const escaped = Array.from(text)
    .map(char => {
      const special: { [char: string]: string } = {
        '\\': '\\\\',
        '\t': '\\t',
        '\n': '\\n',
        '\r': '\\r'
      };
      if (special[char]) {
        return special[char];
      }
      if (char !== ' ' && NOT_PRINTABLE.test(char)) {
        const code = char.codePointAt(0) as number;
        const hex = code.toString(16);
        return code < 0x100
          ? `\\x${hex.padStart(2, '0')}`
          : code < 0x10000
            ? `\\u${hex.padStart(4, '0')}`
            : `\\U${hex.padStart(8, '0')}`;
      }
      return char;
    })
    .join('');
  if (escaped.includes("'") && !escaped.includes('"')) {
    return `"${escaped}"`;
  }
  return `'${escaped.replace(/'/g, "\\'")}'`;
}

// What Python's str.isprintable() refuses: controls, format, separators, unassigned…
const NOT_PRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Z}]/u;

/**
 * Read a size as docs/users/sizes.md defines it; the same verdict as `parse_size` in Python.
 */
export function parseSize(value: string): ParsedSize | ISizeError {
  const text = value.replace(STRIP, '');
  if (!text) {
    return refuse('GPU size is empty');
  }
  if (text.toLowerCase() === 'whole') {
    return { ok: true, form: 'whole', text: 'whole' };
  }
  if (text.startsWith('-')) {
    return refuse(`GPU size ${quote(text)} must be more than zero`, false);
  }
  if (WS.test(text)) {
    return refuse(
      `GPU size ${quote(text)} has a space inside; write it without, e.g. 4G`
    );
  }
  if (OTHER_DIGIT.test(text)) {
    return refuse(`GPU size ${quote(text)} has a digit that is not 0-9`);
  }
  const percent = PERCENT.exec(text);
  if (percent) {
    const { numerator, scale } = fraction(percent[1]);
    // 0.01 <= share <= 100, exactly.
    if (numerator * BigInt(100) < scale || numerator > BigInt(100) * scale) {
      return refuse(
        `GPU share ${quote(text)} must be from 0.01% to 100%`,
        false
      );
    }
    return {
      ok: true,
      form: 'percent',
      percent: Number(percent[1]),
      text
    };
  }
  const amount = AMOUNT.exec(text);
  if (!amount) {
    return refuse(`cannot read GPU size ${quote(text)}`);
  }
  const { numerator, scale } = fraction(amount[1]);
  const unit = amount[2].toLowerCase();
  let unitBytes: bigint;
  if (unit === '') {
    if (numerator % scale !== BigInt(0)) {
      return refuse(`a bare number is MiB and must be whole: ${quote(text)}`);
    }
    unitBytes = BigInt(MiB);
  } else if (unit in UNITS) {
    unitBytes = UNITS[unit];
  } else {
    return refuse(
      `unknown unit ${quote(amount[2])} in GPU size ${quote(text)}`
    );
  }
  if (numerator === BigInt(0)) {
    return refuse(`GPU size ${quote(text)} must be more than zero`, false);
  }
  // Whole MiB, rounded up, as the server stores it.
  const perMiB = scale * BigInt(MiB);
  const mib = (numerator * unitBytes + perMiB - BigInt(1)) / perMiB;
  return { ok: true, form: 'bytes', bytes: Number(mib * BigInt(MiB)), text };
}

/**
 * Check a size against the pool as well: bytes larger than every device are refused, as the
 * server refuses them ("larger than any GPU").
 */
export function checkSize(
  value: string,
  deviceMemory: number[]
): ParsedSize | ISizeError {
  const parsed = parseSize(value);
  if (!parsed.ok || parsed.form !== 'bytes' || deviceMemory.length === 0) {
    return parsed;
  }
  const largest = Math.max(...deviceMemory);
  if (parsed.bytes > largest) {
    return refuse(
      `${parsed.text} is larger than any GPU here (the largest has ${formatBytes(largest)})`,
      false
    );
  }
  return parsed;
}

/**
 * Short human form in the units users type: `7.5G`, `512M`, `80G` (as `format_bytes`).
 */
export function formatBytes(bytes: number): string {
  if (bytes >= GiB) {
    const gib = bytes / GiB;
    return Math.abs(gib - Math.round(gib)) < 0.05
      ? `${gib.toFixed(0)}G`
      : `${gib.toFixed(1)}G`;
  }
  const mib = bytes / MiB;
  return Math.abs(mib - Math.round(mib)) < 0.5
    ? `${mib.toFixed(0)}M`
    : `${mib.toFixed(1)}M`;
}

/**
 * GiB with at most one decimal and no trailing `.0`: `2.1`, `4`, `0.5`.
 */
export function formatGiB(bytes: number): string {
  const gib = Math.round((bytes / GiB) * 10) / 10;
  return Number.isInteger(gib) ? gib.toFixed(0) : gib.toFixed(1);
}
