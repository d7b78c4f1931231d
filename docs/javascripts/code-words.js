// Inline code in a table wraps only at its spaces: each space-separated piece of it goes in a
// `nowrap` span, so the browser never breaks `easyfit-flax[s3]` or `--xla_gpu_...` at a hyphen
// or other punctuation (CSS alone cannot forbid those breaks and still allow the ones at spaces).
// The text is unchanged: what a reader copies is what the page says.
document.addEventListener("DOMContentLoaded", () => {
  for (const code of document.querySelectorAll(".md-typeset td code, .md-typeset th code")) {
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const nodes = [];
    while (walker.nextNode()) nodes.push(walker.currentNode);
    for (const node of nodes) {
      const parts = node.textContent.split(/(\s+)/);
      if (parts.every((part) => part === "" || /\s/.test(part))) continue;
      const words = document.createDocumentFragment();
      for (const part of parts) {
        if (part === "" || /\s/.test(part)) {
          words.append(part);
        } else {
          const word = document.createElement("span");
          word.className = "code-word";
          word.textContent = part;
          words.append(word);
        }
      }
      node.replaceWith(words);
    }
  }
});
