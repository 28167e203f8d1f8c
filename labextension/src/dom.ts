/**
 * A few DOM helpers for the plain-DOM views (no framework: the views update their nodes in
 * place, so focus and an open menu survive an update every second).
 */

/** Attributes of `h`: properties set on the element, `class`, `data-*`, `aria-*`. */
export type Attributes = { [name: string]: string | number | boolean | null };

/**
 * Create an element: `h('button', { class: 'x', 'aria-label': 'Open' }, 'text')`.
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Attributes = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === false) {
      continue;
    }
    if (name === 'class') {
      element.className = String(value);
    } else {
      element.setAttribute(name, value === true ? '' : String(value));
    }
  }
  element.append(...children);
  return element;
}

/** Set an element's text only when it changed (no needless DOM churn). */
export function setText(element: Element, text: string): void {
  if (element.textContent !== text) {
    element.textContent = text;
  }
}

/** Set or remove an attribute only when it changed. */
export function setAttr(
  element: Element,
  name: string,
  value: string | null
): void {
  if (value === null) {
    if (element.hasAttribute(name)) {
      element.removeAttribute(name);
    }
  } else if (element.getAttribute(name) !== value) {
    element.setAttribute(name, value);
  }
}

/** A percentage of `total` for a CSS width, clamped to 0–100. */
export function percentOf(part: number, total: number): string {
  if (!(total > 0)) {
    return '0%';
  }
  const value = Math.min(100, Math.max(0, (part / total) * 100));
  return `${value.toFixed(2)}%`;
}
