// Reads ragloop's /api/chat?format=ai-sdk with the Vercel AI SDK's own client code (the transport useChat uses):
//   npm install ai@7 && node ai-sdk-client.mjs http://127.0.0.1:8000/api/chat?format=ai-sdk "How do I rotate an API key?"
// Prints the assistant message the SDK assembled (its parts: text, source-url / source-document, data-ragloop).
import { DefaultChatTransport, readUIMessageStream } from 'ai';

const [url, question, key] = process.argv.slice(2);
const transport = new DefaultChatTransport({ api: url, headers: key ? { authorization: `Bearer ${key}` } : {} });
const messages = [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: question }] }];
const stream = await transport.sendMessages({
  chatId: 'chat-1', messages, abortSignal: undefined, trigger: 'submit-message', messageId: undefined,
});
let message;
for await (message of readUIMessageStream({ stream, onError: (error) => { throw error; } })) { /* the latest state */ }
console.log(JSON.stringify({ id: message.id, role: message.role, parts: message.parts }));
